/*
delay.FinishedTasks: tasks with a final state, until purged: Done (receipt 1),
Refused (2: never run; 50302-50306 say why), Failed (3: attempts used up, the
target ended the transaction opened for it, or claimed too often), Cancelled (4).
The last error is here; every attempt's is in delay.Log.
Example:     SELECT TaskID, TaskState, LastErrorMessage FROM delay.FinishedTasks WHERE TaskState = N'Failed';
*/
CREATE OR ALTER VIEW delay.FinishedTasks
AS
SELECT
    t.TaskID, t.TargetName, t.SchemaName, t.ProcedureName, t.TaskState, t.Receipt, t.Attempts, t.CreatedAtUtc,
    t.DueAtUtc, t.FirstStartedAtUtc, t.FinishedAtUtc, t.LastErrorNumber, t.LastErrorMessage
FROM delay.Task AS t
WHERE t.TaskState IN (N'Done', N'Refused', N'Failed', N'Cancelled');
