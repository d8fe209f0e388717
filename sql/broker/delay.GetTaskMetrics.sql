/*
delay.GetTaskMetrics: the four task counts and the queue's state that
`mailq-db exporter` reads in its second call (skipped where delayed
execution is not deployed, e.g. Azure SQL Database).
Parameters:  none.
Result set:  one row: PendingTasks (Scheduled, Retrying), OverdueTasks
             (pending, NextRunAtUtc more than 60 s ago, as delay.Health),
             HeldTasks (0: no task state holds a task yet), FailedTasks
             (Failed, kept until purged), QueueReceiveEnabled (0: poison
             message handling disabled dbo.DelayServiceQueue; NULL: the
             caller may not see the queue: GRANT VIEW DEFINITION on it),
             BrokerEnabled (sys.databases.is_broker_enabled).
Plan:        one seek per state on IX_Task_TaskState_NextRunAtUtc (the
             overdue count: the pending ranges up to now - 60 s);
             cost grows with pending and failed tasks, never with Done ones.
Errors:      none of its own.
Transaction: reads only; opens none.  Isolation: sets READ COMMITTED itself.
Lock order:  none (no locking reads).
Example:     EXEC delay.GetTaskMetrics;
*/
CREATE OR ALTER PROCEDURE delay.GetTaskMetrics
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Cutoff DATETIME2(3) = DATEADD(SECOND, -60, SYSUTCDATETIME());

    SELECT
        (
            SELECT COUNT_BIG(*) FROM delay.Task AS t
            WHERE t.TaskState IN (N'Scheduled', N'Retrying')
        ) AS PendingTasks,
        (
            SELECT COUNT_BIG(*) FROM delay.Task AS t
            WHERE t.TaskState IN (N'Scheduled', N'Retrying') AND t.NextRunAtUtc < @Cutoff
        ) AS OverdueTasks,
        CAST(0 AS BIGINT) AS HeldTasks,
        (
            SELECT COUNT_BIG(*) FROM delay.Task AS t
            WHERE t.TaskState = N'Failed'
        ) AS FailedTasks,
        (
            SELECT CAST(q.is_receive_enabled AS INT) FROM sys.service_queues AS q
            WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue')
        ) AS QueueReceiveEnabled,
        (
            SELECT CAST(d.is_broker_enabled AS INT) FROM sys.databases AS d
            WHERE d.database_id = DB_ID()
        ) AS BrokerEnabled;
END;
