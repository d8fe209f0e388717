/*
Service MailqDelayService on dbo.DelayServiceQueue.  Each task is a dialog
from this service to itself (TO SERVICE N'MailqDelayService',
N'CURRENT DATABASE'); both endpoints live on the one queue.
*/
IF NOT EXISTS (SELECT 1 FROM sys.services WHERE name = N'MailqDelayService')
    CREATE SERVICE MailqDelayService
        ON QUEUE dbo.DelayServiceQueue (MailqDelayContract);
