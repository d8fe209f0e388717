/*
Queue dbo.DelayServiceQueue: the DialogTimer, DelayRequest, EndDialog and Error
messages of every delayed task.
Created without ACTIVATION: the activation procedure dbo.ProcessDelayQueue
RECEIVEs from this queue, so the queue exists first, then the procedure, then
broker/dbo.DelayServiceQueue.activation.sql switches activation on.
RETENTION = OFF: received messages are deleted (the log table keeps history).
POISON_MESSAGE_HANDLING stays ON as the last safety net: dbo.ProcessDelayQueue
never lets a RECEIVE transaction roll back because of a target (targets run
in their own transaction after the RECEIVE committed), so if the queue is ever
disabled (five rollbacks in a row of a transaction that received from it) the
cause is a bug to fix, and delay.Health shows is_receive_enabled = 0.
*/
IF OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') IS NULL
    CREATE QUEUE dbo.DelayServiceQueue
        WITH STATUS = ON,
        RETENTION = OFF,
        POISON_MESSAGE_HANDLING (STATUS = ON);
