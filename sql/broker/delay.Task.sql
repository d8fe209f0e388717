/*
delay.Task: the queue, one row per platform row the trigger saw (TaskID = its ID),
with the target and its values copied when scheduled: a later UPDATE of the platform
row changes nothing that runs.
TaskState:   Pending -> Claimed -> Done | Pending (retry after a backoff) | Failed |
             Held (the target changed; Pending again once listed again); Pending and
             Held -> Cancelled, or Refused (disallowed); a bad row -> Refused at once.
Receipt:     F108219's value: 0 pending, 1 Done, 2 Refused, 3 Failed, 4 Cancelled.
ClaimToken, LeaseUntilUtc: a claim, taken again once its lease passed unless a reader
runs it (its run holds the row; the sweep reads past).  Attempts: runs with an outcome;
Claims: times claimed; CreatedBy: ORIGINAL_LOGIN() of the inserter (who may cancel).
No filtered index, indexed computed column or indexed view (the trigger writes it in
the platform's session, whatever its SET options); LOCK_ESCALATION = DISABLE, so a
large platform INSERT never locks the table against the readers' READPAST claims.
*/
IF OBJECT_ID(N'delay.Task', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Task (
        TaskID BIGINT NOT NULL,
        TargetName NVARCHAR(400) NULL,
        SchemaName SYSNAME NULL,
        ProcedureName SYSNAME NULL,
        DelaySeconds INT NULL,
        Param1 NVARCHAR(200) NULL,
        Param2 NVARCHAR(200) NULL,
        Param3 NVARCHAR(200) NULL,
        Param4 NVARCHAR(200) NULL,
        Param5 NVARCHAR(200) NULL,
        TaskState NVARCHAR(16) NOT NULL,
        Receipt AS CAST(CASE TaskState
                WHEN N'Done' THEN 1 WHEN N'Refused' THEN 2 WHEN N'Failed' THEN 3 WHEN N'Cancelled' THEN 4 ELSE 0
            END AS TINYINT),
        Attempts INT NOT NULL CONSTRAINT DF_Task_Attempts DEFAULT (0),
        Claims INT NOT NULL CONSTRAINT DF_Task_Claims DEFAULT (0),
        CreatedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Task_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        DueAtUtc DATETIME2(3) NULL,
        NextRunAtUtc DATETIME2(3) NULL,
        ClaimToken UNIQUEIDENTIFIER NULL,
        LeaseUntilUtc DATETIME2(3) NULL,
        FirstStartedAtUtc DATETIME2(3) NULL,
        LastStartedAtUtc DATETIME2(3) NULL,
        FinishedAtUtc DATETIME2(3) NULL,
        LastErrorNumber INT NULL,
        LastErrorMessage NVARCHAR(2048) NULL,
        CreatedBy NVARCHAR(128) NULL,
        CONSTRAINT PK_Task PRIMARY KEY CLUSTERED (TaskID),
        CONSTRAINT CK_Task_TaskState CHECK (
            TaskState IN (N'Pending', N'Claimed', N'Held', N'Done', N'Failed', N'Refused', N'Cancelled')
        ),
        CONSTRAINT CK_Task_Attempts CHECK (Attempts >= 0 AND Claims >= 0)
    );
    -- Dynamic only because DacFx models no separate ALTER TABLE ... SET.
    EXEC sys.sp_executesql N'ALTER TABLE delay.Task SET (LOCK_ESCALATION = DISABLE);';
END;
