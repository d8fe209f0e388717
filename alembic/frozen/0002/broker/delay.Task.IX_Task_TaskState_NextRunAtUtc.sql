/*
IX_Task_TaskState_NextRunAtUtc: the operator views (pending, running, failed,
refused) and the health view filter on TaskState; a seek on the state, ordered
by the next run, instead of a scan of every task ever scheduled.
*/
IF NOT EXISTS (
    SELECT 1 FROM sys.indexes
    WHERE name = N'IX_Task_TaskState_NextRunAtUtc' AND object_id = OBJECT_ID(N'delay.Task')
)
    CREATE NONCLUSTERED INDEX IX_Task_TaskState_NextRunAtUtc
        ON delay.Task (TaskState, NextRunAtUtc)
        INCLUDE (TargetName, Attempts, LeaseUntilUtc);
