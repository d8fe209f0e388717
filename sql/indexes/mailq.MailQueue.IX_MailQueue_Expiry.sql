/*
IX_MailQueue_Expiry: mailq.FinalizeMail's expiry step (queued mail past ExpiresAtUtc).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Expiry' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_Expiry
    ON mailq.MailQueue (ExpiresAtUtc ASC, ID ASC)
    INCLUDE (VisibleAtUtc)
    WHERE Status IN (N'UnSent', N'Sending') AND ExpiresAtUtc IS NOT NULL;
