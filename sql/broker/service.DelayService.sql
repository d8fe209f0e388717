/*
Service MailqDelayService on dbo.DelayServiceQueue: the dispatcher's dialog
goes from this service to itself (TO SERVICE N'MailqDelayService', N'CURRENT DATABASE').
*/
IF NOT EXISTS (SELECT 1 FROM sys.services WHERE name = N'MailqDelayService')
    CREATE SERVICE MailqDelayService
        ON QUEUE dbo.DelayServiceQueue (MailqDelayContract);
