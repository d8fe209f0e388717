/*
Contract //mailq-db/DelayContract: the dialog of one delayed task.  The service
talks to itself (one queue), so the initiator sends the only message type.
*/
IF NOT EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = N'//mailq-db/DelayContract')
    CREATE CONTRACT [//mailq-db/DelayContract] ([//mailq-db/DelayRequest] SENT BY INITIATOR);
