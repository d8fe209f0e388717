/*
IX_Task_Due: readers claim Pending rows in NextRunAtUtc order and sweep Claimed
ones; the timer reads the first Pending row; delay.GetTaskMetrics counts by
state.  No included column: a running target's reader changes only the
clustered row, so these reads never wait for a target.
*/
IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = N'IX_Task_Due' AND object_id = OBJECT_ID(N'delay.Task'))
    CREATE NONCLUSTERED INDEX IX_Task_Due ON delay.Task (TaskState, NextRunAtUtc);
