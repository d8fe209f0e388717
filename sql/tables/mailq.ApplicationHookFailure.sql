/*
mailq.ApplicationHookFailure: events a hook gave up on (docs/hooks.md): after
MaxAttempts failed calls, or at once on 266 (the hook ended our transaction);
the cursor moves past them.  History: nothing deletes rows.
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
