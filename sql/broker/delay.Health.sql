/*
delay.Health: one row: can delayed execution run tasks, and how many wait?
(delay.Monitor says what to do about each problem.)  IsBrokerEnabled,
IsReceiveEnabled (0: the queue is disabled), IsActivationEnabled, MaxQueueReaders,
IsEnabledHere (0: a copy with a new broker identity, which runs nothing until
delay.EnableThisDatabase), IsTrustworthy, IsDbChaining, DispatcherArmedForUtc,
LastWokenAtUtc, PendingTasks, OverdueTasks, HeldTasks, FailedTasks (as
delay.GetTaskMetrics), RefusedTasks, ReceiptsDue.
Permissions: SELECT, and VIEW DEFINITION on the queue (both granted to MailqAdmin);
no server permission.
Example:     SELECT IsReceiveEnabled, IsEnabledHere, OverdueTasks, HeldTasks FROM delay.Health;
*/
CREATE OR ALTER VIEW delay.Health
AS
WITH D AS (
    SELECT dp.BrokerGuid, dp.ArmedForUtc, dp.LastWokenAtUtc, s.OverdueSeconds
    FROM delay.Dispatcher AS dp CROSS JOIN delay.Setting AS s
),

Q AS (
    SELECT
        IsReceiveEnabled = sq.is_receive_enabled, IsActivationEnabled = sq.is_activation_enabled,
        MaxQueueReaders = sq.max_readers
    FROM sys.service_queues AS sq
    WHERE sq.object_id = OBJECT_ID(N'dbo.DelayServiceQueue')
)

SELECT
    IsBrokerEnabled = db.is_broker_enabled,
    q.IsReceiveEnabled,
    q.IsActivationEnabled,
    q.MaxQueueReaders,
    IsEnabledHere = CAST(IIF(d.BrokerGuid = db.service_broker_guid, 1, 0) AS BIT),
    IsTrustworthy = db.is_trustworthy_on,
    IsDbChaining = db.is_db_chaining_on,
    DispatcherArmedForUtc = d.ArmedForUtc,
    d.LastWokenAtUtc,
    PendingTasks = (SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState IN (N'Pending', N'Claimed')),
    OverdueTasks = (
        SELECT COUNT_BIG(*) FROM delay.Task AS t
        WHERE t.TaskState = N'Pending' AND t.NextRunAtUtc < DATEADD(SECOND, -d.OverdueSeconds, SYSUTCDATETIME())
    ),
    HeldTasks = (SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState = N'Held'),
    FailedTasks = (SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState = N'Failed'),
    RefusedTasks = (SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState = N'Refused'),
    ReceiptsDue = (SELECT COUNT_BIG(*) FROM delay.ReceiptDue)
FROM sys.databases AS db
CROSS JOIN D AS d
LEFT OUTER JOIN Q AS q ON 1 = 1
WHERE db.database_id = DB_ID();
