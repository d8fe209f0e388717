/*
IX_Task_FinishedAtUtc: delay.PurgeHistory deletes final tasks oldest first, a
bounded batch at a time.
*/
IF NOT EXISTS (
    SELECT 1 FROM sys.indexes WHERE name = N'IX_Task_FinishedAtUtc' AND object_id = OBJECT_ID(N'delay.Task')
)
    CREATE NONCLUSTERED INDEX IX_Task_FinishedAtUtc ON delay.Task (FinishedAtUtc);
