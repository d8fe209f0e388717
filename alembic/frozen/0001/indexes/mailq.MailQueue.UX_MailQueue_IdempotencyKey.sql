/*
UX_MailQueue_IdempotencyKey: one mail per idempotency key.  mailq.EnqueueMail
looks the key up WITH (UPDLOCK, HOLDLOCK) before inserting: the range lock on
this index stops two sessions from both seeing the key absent.  Filtered, so
mails without a key (the common case) cost nothing.  A key becomes free again
once mailq.PurgeMail deletes its mail.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'UX_MailQueue_IdempotencyKey' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE UNIQUE NONCLUSTERED INDEX UX_MailQueue_IdempotencyKey
    ON mailq.MailQueue (IdempotencyKey)
    WHERE IdempotencyKey IS NOT NULL;
END;
