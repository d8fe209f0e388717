/*
UX_Task_IdempotencyKey: one task per idempotency key of
dbo.InitiateDelayExecution (a reconnecting caller may resend its call); the
procedure finds an earlier task by a seek.  Filtered: most tasks have no key.
*/
IF NOT EXISTS (
    SELECT 1 FROM sys.indexes
    WHERE name = N'UX_Task_IdempotencyKey' AND object_id = OBJECT_ID(N'delay.Task')
)
    CREATE UNIQUE NONCLUSTERED INDEX UX_Task_IdempotencyKey
        ON delay.Task (IdempotencyKey)
        WHERE IdempotencyKey IS NOT NULL;
