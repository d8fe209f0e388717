/*
delay.FailedTasks: tasks given up (receipt 3): their attempts ran out, the
target managed the transaction opened for it (266), or a broker error ended the
conversation.  The last error is here; every attempt's error is in delay.Log.
Columns:     TaskID, TargetName, SchemaName, ProcedureName, Attempts,
             CreatedAtUtc, DueAtUtc, FirstStartedAtUtc, FinishedAtUtc,
             LastErrorNumber, LastErrorMessage
Example:     SELECT TaskID, LastErrorMessage FROM delay.FailedTasks;
*/
CREATE OR ALTER VIEW delay.FailedTasks
AS
SELECT
    t.TaskID,
    t.TargetName,
    t.SchemaName,
    t.ProcedureName,
    t.Attempts,
    t.CreatedAtUtc,
    t.DueAtUtc,
    t.FirstStartedAtUtc,
    t.FinishedAtUtc,
    t.LastErrorNumber,
    t.LastErrorMessage
FROM delay.Task AS t
WHERE t.TaskState = N'Failed';
