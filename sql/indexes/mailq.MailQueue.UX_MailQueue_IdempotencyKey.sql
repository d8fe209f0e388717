/*
UX_MailQueue_IdempotencyKey: one mail per idempotency key, compared as binary
text (the column's collation since revision 0007).  mailq.EnqueueMail
serializes callers of one key with an application lock on the key and then
looks it up: no key-range lock on this index, so enqueues of neighbouring
keys never wait for each other.  Filtered, so mails without a key (the common
case) cost nothing.  A key becomes free again once mailq.PurgeMail deletes
its mail.
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
