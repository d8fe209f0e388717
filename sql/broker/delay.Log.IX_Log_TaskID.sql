/*
IX_Log_TaskID: a task's log rows by a seek.
*/
IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = N'IX_Log_TaskID' AND object_id = OBJECT_ID(N'delay.Log'))
    CREATE NONCLUSTERED INDEX IX_Log_TaskID ON delay.Log (TaskID, LogId);
