/*
UX_MailQueue_IdempotencyKey: one mail per idempotency key, compared as binary
text (the column's collation).  Enqueues of one key serialize on an
application lock on the key, never on key-range locks of this index.
Filtered: mail without a key costs nothing; a key is free again once its mail
is purged.
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
