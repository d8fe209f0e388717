/*
delay.PendingTasks: tasks not finished: Pending (waiting for NextRunAtUtc or a
retry's backoff), Claimed (a reader runs it or is about to; LeaseUntilUtc 9999-12-31
while it runs, and a locking read of that row waits for the target), Held (the
target changed since it was listed: it runs once a db_owner lists it again;
HeldReason says why).  OverdueSeconds > 0: due and not started.
Example:     SELECT TaskID, TargetName, TaskState, NextRunAtUtc FROM delay.PendingTasks ORDER BY NextRunAtUtc;
*/
CREATE OR ALTER VIEW delay.PendingTasks
AS
SELECT
    t.TaskID, t.TargetName, t.TaskState, t.Attempts, t.Claims, t.CreatedAtUtc, t.DueAtUtc, t.NextRunAtUtc,
    t.LeaseUntilUtc, t.FirstStartedAtUtc,
    OverdueSeconds = IIF(
        t.TaskState = N'Pending' AND t.NextRunAtUtc < SYSUTCDATETIME(),
        DATEDIFF_BIG(SECOND, t.NextRunAtUtc, SYSUTCDATETIME()), 0
    ),
    HeldReason = IIF(t.TaskState = N'Held', t.LastErrorMessage, NULL),
    t.LastErrorNumber, t.LastErrorMessage
FROM delay.Task AS t
WHERE t.TaskState IN (N'Pending', N'Claimed', N'Held');
