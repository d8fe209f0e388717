/*
mailq.ApplicationHookFailure: events a hook could not handle (docs/hooks.md).
mailq.RunApplicationHooks writes one row when an event's hook call failed
MaxAttempts times in a row (mailq.ApplicationHook), or once when the hook
committed or rolled back the transaction opened for it (error 266 with no
transaction left: its work may be committed, so it is not called again),
then moves the cursor past the event: one poisoned event never stops the
application's later events.  Rows are history: nothing deletes them (an
operator may, after reading them).  Small by nature (one row per given-up
event); read it by AppName with the clustered key's order.
*/
IF OBJECT_ID(N'mailq.ApplicationHookFailure', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationHookFailure (
        FailureID BIGINT IDENTITY (1, 1) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        EventID BIGINT NOT NULL,
        MailID BIGINT NOT NULL,
        EventType NVARCHAR(32) NOT NULL,
        HookProcedure NVARCHAR(300) NOT NULL,
        Attempts INT NOT NULL,
        ErrorNumber INT NULL,
        ErrorMessage NVARCHAR(4000) NULL,
        RecordedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationHookFailure_RecordedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_ApplicationHookFailure PRIMARY KEY CLUSTERED (FailureID)
    );
END;
