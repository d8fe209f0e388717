/*
delay.Health: one row for operators and `mailq-db doctor`: is delayed execution
able to run tasks?
Columns:     IsBrokerEnabled       sys.databases.is_broker_enabled of this database
             IsReceiveEnabled      0 = the queue is disabled (poison message
                                   handling after five rollbacks in a row):
                                   ALTER QUEUE dbo.DelayServiceQueue WITH STATUS = ON
             IsEnqueueEnabled, IsActivationEnabled, IsPoisonMessageHandlingEnabled
             MaxQueueReaders, ActivationProcedure
             ActiveReaders         activated copies of dbo.ProcessDelayQueue now
                                   (sys.dm_broker_activated_tasks)
             QueuedMessages        rows in the queue (partition statistics of its
                                   internal table: no lock on the queue)
             OpenConversations     endpoints of the delay service not yet closed
                                   (state <> 'CD'); about one per pending task
             TransmissionQueue     messages of the service stuck in
                                   sys.transmission_queue (broker disabled, ...)
             PendingTasks, RunningTasks, OverdueTasks (pending, due more than
                                   60 s ago), FailedTasks, RefusedTasks
Permissions: sys.dm_broker_activated_tasks needs VIEW SERVER STATE (VIEW SERVER
             PERFORMANCE STATE on SQL Server 2022); without it the view fails.
Example:     SELECT IsReceiveEnabled, ActiveReaders, OverdueTasks FROM delay.Health;
*/
CREATE OR ALTER VIEW delay.Health
AS
SELECT
    IsBrokerEnabled = (
        SELECT d.is_broker_enabled FROM sys.databases AS d WHERE d.database_id = DB_ID()
    ),
    IsReceiveEnabled = q.is_receive_enabled,
    IsEnqueueEnabled = q.is_enqueue_enabled,
    IsActivationEnabled = q.is_activation_enabled,
    IsPoisonMessageHandlingEnabled = q.is_poison_message_handling_enabled,
    MaxQueueReaders = q.max_readers,
    ActivationProcedure = q.activation_procedure,
    ActiveReaders = (
        SELECT COUNT(*)
        FROM sys.dm_broker_activated_tasks AS bat
        WHERE bat.database_id = DB_ID() AND bat.queue_id = q.object_id
    ),
    QueuedMessages = (
        SELECT SUM(ps.row_count)
        FROM sys.internal_tables AS it
        INNER JOIN sys.dm_db_partition_stats AS ps ON it.object_id = ps.object_id
        WHERE it.parent_object_id = q.object_id AND ps.index_id IN (0, 1)
    ),
    OpenConversations = (
        SELECT COUNT_BIG(*)
        FROM sys.conversation_endpoints AS ce
        INNER JOIN sys.services AS s ON ce.service_id = s.service_id
        WHERE s.name = N'MailqDelayService' AND ce.state <> 'CD'
    ),
    TransmissionQueue = (
        SELECT COUNT_BIG(*)
        FROM sys.transmission_queue AS tq
        WHERE tq.from_service_name = N'MailqDelayService'
    ),
    PendingTasks = (
        SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState IN (N'Scheduled', N'Retrying')
    ),
    RunningTasks = (
        SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState = N'Running'
    ),
    OverdueTasks = (
        SELECT COUNT_BIG(*)
        FROM delay.Task AS t
        WHERE
            t.TaskState IN (N'Scheduled', N'Retrying')
            AND t.NextRunAtUtc < DATEADD(SECOND, -60, SYSUTCDATETIME())
    ),
    FailedTasks = (
        SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState = N'Failed'
    ),
    RefusedTasks = (
        SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState = N'Refused'
    )
FROM sys.service_queues AS q
WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue');
