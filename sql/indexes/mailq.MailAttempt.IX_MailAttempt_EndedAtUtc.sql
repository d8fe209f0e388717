/*
IX_MailAttempt_EndedAtUtc: closed attempts by end time, for the reporting views.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailAttempt_EndedAtUtc' AND object_id = OBJECT_ID(N'mailq.MailAttempt')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailAttempt_EndedAtUtc
    ON mailq.MailAttempt (EndedAtUtc ASC)
    INCLUDE (Outcome, SmtpCode)
    WHERE EndedAtUtc IS NOT NULL;
END;
