/*
delay.PendingTasks: tasks waiting for their time: Scheduled (first run) or
Retrying (after a failed attempt), soonest first when ordered by NextRunAtUtc.
Columns:     TaskID, TargetName, TaskState, Attempts, CreatedAtUtc, DueAtUtc,
             NextRunAtUtc, OverdueSeconds (> 0: due but not yet started, e.g.
             activation is off or every reader is busy), LastErrorNumber,
             LastErrorMessage
Example:     SELECT TaskID, TargetName, NextRunAtUtc FROM delay.PendingTasks ORDER BY NextRunAtUtc;
*/
CREATE OR ALTER VIEW delay.PendingTasks
AS
SELECT
    t.TaskID,
    t.TargetName,
    t.TaskState,
    t.Attempts,
    t.CreatedAtUtc,
    t.DueAtUtc,
    t.NextRunAtUtc,
    OverdueSeconds = IIF(
        t.NextRunAtUtc < SYSUTCDATETIME(), DATEDIFF_BIG(SECOND, t.NextRunAtUtc, SYSUTCDATETIME()), 0
    ),
    t.LastErrorNumber,
    t.LastErrorMessage
FROM delay.Task AS t
WHERE t.TaskState IN (N'Scheduled', N'Retrying');
