/*
Activation of dbo.DelayServiceQueue: Service Broker starts dbo.ProcessDelayQueue,
up to MAX_QUEUE_READERS copies: 5 here; `-x readers=N` (1-32767) changes it by an
ALTER QUEUE after each revision, and a DBA may at any time.  EXECUTE AS OWNER: the
readers' bookkeeping runs as dbo; every target runs as MailqRunner (delay.RunTask).
A separate file: the procedure exists first, and it RECEIVEs from the queue.
*/
ALTER QUEUE dbo.DelayServiceQueue
    WITH ACTIVATION (STATUS = ON, PROCEDURE_NAME = dbo.ProcessDelayQueue, MAX_QUEUE_READERS = 5, EXECUTE AS OWNER);
