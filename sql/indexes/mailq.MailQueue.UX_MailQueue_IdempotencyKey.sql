/*
UX_MailQueue_IdempotencyKey: one mail per idempotency key (binary); filtered, so
mail without a key costs nothing.  Enqueues serialize on an applock on the key.
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
