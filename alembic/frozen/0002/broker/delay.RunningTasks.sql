/*
delay.RunningTasks: tasks whose target is running now (or whose runner died and
the watchdog has not looked yet: LeaseUntilUtc in the past).
Columns:     TaskID, TargetName, SchemaName, ProcedureName, Attempts,
             FirstStartedAtUtc, LastStartedAtUtc, RunningSeconds, LeaseUntilUtc
Example:     SELECT TaskID, TargetName, RunningSeconds FROM delay.RunningTasks;
*/
CREATE OR ALTER VIEW delay.RunningTasks
AS
SELECT
    t.TaskID,
    t.TargetName,
    t.SchemaName,
    t.ProcedureName,
    t.Attempts,
    t.FirstStartedAtUtc,
    t.LastStartedAtUtc,
    RunningSeconds = DATEDIFF_BIG(SECOND, t.LastStartedAtUtc, SYSUTCDATETIME()),
    t.LeaseUntilUtc
FROM delay.Task AS t
WHERE t.TaskState = N'Running';
