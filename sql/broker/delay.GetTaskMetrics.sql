/*
delay.GetTaskMetrics: the four counts of delayed tasks that monitoring reads, one
row (delay.Health has the same columns): PendingTasks BIGINT (Pending or Claimed:
scheduled, not final, not held), OverdueTasks BIGINT (Pending, due longer ago than
delay.Setting.OverdueSeconds), HeldTasks BIGINT (waiting for their target to be
listed again), FailedTasks BIGINT (given up, until purged).
Cost:        seeks on IX_Task_Due; never waits for a running target.
Security:    granted to MailqAdmin.
Example:     EXEC delay.GetTaskMetrics;
*/
CREATE OR ALTER PROCEDURE delay.GetTaskMetrics
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @OverdueBefore DATETIME2(3) = DATEADD(SECOND, -60, SYSUTCDATETIME());
    SELECT @OverdueBefore = DATEADD(SECOND, -s.OverdueSeconds, SYSUTCDATETIME()) FROM delay.Setting AS s
    WHERE s.SettingId = 1;
    SELECT
        (SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState IN (N'Pending', N'Claimed')) AS PendingTasks,
        (
            SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState = N'Pending' AND t.NextRunAtUtc < @OverdueBefore
        ) AS OverdueTasks,
        (SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState = N'Held') AS HeldTasks,
        (SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState = N'Failed') AS FailedTasks;
END;
