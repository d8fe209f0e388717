/*
Queue dbo.DelayServiceQueue: the dispatcher's DialogTimer and MailqDelayRequest
messages (and EndDialog/Error when its conversation ends): a handful of messages at
any load, since tasks are rows of delay.Task.  Activation is added by
broker/dbo.DelayServiceQueue.activation.sql once the procedure exists.
POISON_MESSAGE_HANDLING stays ON as the last safety net: a transaction that
RECEIVEs here does nothing else, so it has nothing to roll back for.
*/
IF OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') IS NULL
    CREATE QUEUE dbo.DelayServiceQueue WITH STATUS = ON, RETENTION = OFF, POISON_MESSAGE_HANDLING (STATUS = ON);
