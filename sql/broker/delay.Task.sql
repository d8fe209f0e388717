/*
delay.Task: the bookkeeping of every scheduled row of dbo.tabDIYTable12402,
kept beside the platform's table rather than in it.
    TaskID             = dbo.tabDIYTable12402.ID (the task ID InitiateDelayExecution returns)
    ConversationHandle the initiator handle of the task's own dialog: its
                       conversation timer is the delay, the retry backoff and
                       the watchdog lease in turn; NULL for refused rows
    TaskState          Scheduled -> Running -> Done
                                           -> Retrying -> Running ... -> Failed
                       Scheduled/Retrying -> Cancelled; new row -> Refused
    Receipt            what the platform's F108219 is set to:
                       0 pending (Scheduled, Running, Retrying), 1 Done,
                       2 Refused, 3 Failed (attempts exhausted or not retryable),
                       4 Cancelled
    DueAtUtc           CreatedAtUtc + delay: when the task should first run
    NextRunAtUtc       when it runs next (DueAtUtc, then each retry's time)
    LeaseUntilUtc      while Running: when the watchdog looks at the runner
    FirstStartedAtUtc  the first run's start (lateness = this - DueAtUtc)
    CreatedBy          ORIGINAL_LOGIN() of the session that inserted the row:
                       MailqDelayCaller members may cancel only their own tasks
    IdempotencyKey     InitiateDelayExecution's @IdempotencyKey: a resent call
                       with the same key returns the first call's task
Rows are written by the trigger on dbo.tabDIYTable12402 (set-based), by
dbo.ProcessDelayQueue and by dbo.CancelDelayExecution only.
*/
IF OBJECT_ID(N'delay.Task', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Task (
        TaskID BIGINT NOT NULL,
        ConversationHandle UNIQUEIDENTIFIER NULL,
        TargetName NVARCHAR(400) NULL,
        SchemaName SYSNAME NULL,
        ProcedureName SYSNAME NULL,
        DelaySeconds INT NULL,
        TaskState NVARCHAR(16) NOT NULL,
        Receipt AS CAST(CASE TaskState
                WHEN N'Done' THEN 1
                WHEN N'Refused' THEN 2
                WHEN N'Failed' THEN 3
                WHEN N'Cancelled' THEN 4
                ELSE 0
            END AS TINYINT),
        Attempts INT NOT NULL CONSTRAINT DF_Task_Attempts DEFAULT (0),
        CreatedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Task_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        DueAtUtc DATETIME2(3) NULL,
        NextRunAtUtc DATETIME2(3) NULL,
        LeaseUntilUtc DATETIME2(3) NULL,
        FirstStartedAtUtc DATETIME2(3) NULL,
        LastStartedAtUtc DATETIME2(3) NULL,
        FinishedAtUtc DATETIME2(3) NULL,
        LastErrorNumber INT NULL,
        LastErrorMessage NVARCHAR(4000) NULL,
        CreatedBy NVARCHAR(128) NULL,
        IdempotencyKey NVARCHAR(100) NULL,
        CONSTRAINT PK_Task PRIMARY KEY CLUSTERED (TaskID),
        CONSTRAINT CK_Task_TaskState CHECK (
            TaskState IN (N'Scheduled', N'Running', N'Retrying', N'Done', N'Failed', N'Refused', N'Cancelled')
        ),
        CONSTRAINT CK_Task_Attempts CHECK (Attempts >= 0)
    );
END;
