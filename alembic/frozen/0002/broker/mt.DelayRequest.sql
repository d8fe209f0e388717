/*
Message type MailqDelayRequest: "run task N now".  Sent only for a delay
of 0 seconds (every other delay is a conversation timer, whose DialogTimer
message is a system type).  Body: the task ID as BINARY(8)
(CAST(TaskID AS BINARY(8)), read back with CAST(message_body AS BIGINT)).
VALIDATION = NONE: the body is not XML and only our own trigger sends it.
*/
IF NOT EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = N'MailqDelayRequest')
    CREATE MESSAGE TYPE MailqDelayRequest VALIDATION = NONE;
