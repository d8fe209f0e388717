/*
Contract MailqDelayContract: the dispatcher's self-dialog (the timer on its
initiator side; wake requests are sent by the initiator).
*/
IF NOT EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = N'MailqDelayContract')
    CREATE CONTRACT MailqDelayContract (MailqDelayRequest SENT BY INITIATOR);
