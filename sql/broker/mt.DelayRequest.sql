/*
Message type MailqDelayRequest: "look for due tasks now", sent by a reader that
claimed a full batch, so that activation starts another reader.  No body
(VALIDATION = EMPTY).  The dispatcher's other message is its timer's DialogTimer.
*/
IF NOT EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = N'MailqDelayRequest')
    CREATE MESSAGE TYPE MailqDelayRequest VALIDATION = EMPTY;
