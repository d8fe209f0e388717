/*
IX_Log_TaskID: the failed and refused views show each task's log rows; a seek
by task instead of a scan of the whole log.
*/
IF NOT EXISTS (
    SELECT 1 FROM sys.indexes
    WHERE name = N'IX_Log_TaskID' AND object_id = OBJECT_ID(N'delay.Log')
)
    CREATE NONCLUSTERED INDEX IX_Log_TaskID
        ON delay.Log (TaskID, LogId);
