/*
Contract MailqDelayContract: the dialog of one delayed task.  The service
talks to itself (one queue), so the initiator sends the only message type.
*/
IF NOT EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = N'MailqDelayContract')
    CREATE CONTRACT MailqDelayContract (MailqDelayRequest SENT BY INITIATOR);
