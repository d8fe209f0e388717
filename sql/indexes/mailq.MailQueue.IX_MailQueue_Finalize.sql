/*
IX_MailQueue_Finalize: mailq.FinalizeMail's last-attempt step (lease expired -> Failed).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Finalize' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_Finalize
    ON mailq.MailQueue (VisibleAtUtc ASC, ID ASC)
    WHERE Status IN (N'UnSent', N'Sending') AND AttemptsRemaining = 0;
