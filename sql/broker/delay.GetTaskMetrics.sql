/*
delay.GetTaskMetrics: the counts of delayed tasks that monitoring reads (`mailq-db
exporter`), one row, read from delay.Health: PendingTasks BIGINT (Pending or Claimed:
scheduled, not final, not held), OverdueTasks BIGINT (Pending, due longer ago than
delay.Setting.OverdueSeconds), HeldTasks BIGINT (waiting for their target to be
listed again), FailedTasks BIGINT (given up, until purged), QueueReceiveEnabled INT
(0: the queue is disabled; NULL: the caller may not see it: VIEW DEFINITION on
dbo.DelayServiceQueue), BrokerEnabled INT.
Cost:        seeks on IX_Task_Due; never waits for a running target.  Isolation: READ COMMITTED.
Security:    granted to MailqAdmin and MailqMonitor.
Example:     EXEC delay.GetTaskMetrics;
*/
CREATE OR ALTER PROCEDURE delay.GetTaskMetrics
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SELECT
        h.PendingTasks, h.OverdueTasks, h.HeldTasks, h.FailedTasks,
        QueueReceiveEnabled = CAST(h.IsReceiveEnabled AS INT), BrokerEnabled = CAST(h.IsBrokerEnabled AS INT)
    FROM delay.Health AS h;
END;
