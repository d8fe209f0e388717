/*
IX_MailAttempt_EndedAtUtc serves the reporting views (throughput per hour,
recent failures): closed attempts by end time, so "the last 24 hours" is a
range seek.
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
