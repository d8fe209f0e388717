/*
IX_MailQueue_Finalize: mailq.FinalizeMail's first step (a mail on its last
attempt whose lease expired becomes Failed).  Keys (VisibleAtUtc, ID),
filtered to Status IN (UnSent, Sending) AND AttemptsRemaining = 0.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Finalize' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_Finalize
    ON mailq.MailQueue (VisibleAtUtc ASC, ID ASC)
    WHERE Status IN (N'UnSent', N'Sending') AND AttemptsRemaining = 0;
