/*
delay.Log: what happened to tasks besides running well, one row per event:
Refused (never run, 50302-50306), Failed (a run failed, will be retried), GaveUp
(the last failure; receipt 3), Held (the target changed: 50307, 50340, 50540),
Released (listed again), Cancelled (by a cancel, or its ID reused: 50332),
Receipt (the platform refused a receipt: 50548), Dispatcher (its conversation
begun again, the database enabled).  Purged by delay.PurgeHistory.
*/
IF OBJECT_ID(N'delay.Log', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Log (
        LogId BIGINT IDENTITY (1, 1) NOT NULL,
        LoggedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Log_LoggedAtUtc DEFAULT (SYSUTCDATETIME()),
        TaskID BIGINT NULL,
        EventName NVARCHAR(16) NOT NULL,
        TargetName NVARCHAR(400) NULL,
        Attempt INT NULL,
        ErrorNumber INT NULL,
        ErrorMessage NVARCHAR(2048) NULL,
        CONSTRAINT PK_Log PRIMARY KEY CLUSTERED (LogId),
        CONSTRAINT CK_Log_EventName CHECK (
            EventName IN (
                N'Refused', N'Failed', N'GaveUp', N'Held', N'Released', N'Cancelled', N'Receipt', N'Dispatcher'
            )
        )
    );
    -- Dynamic only because DacFx models no separate ALTER TABLE ... SET.
    EXEC sys.sp_executesql N'ALTER TABLE delay.Log SET (LOCK_ESCALATION = DISABLE);';
END;
