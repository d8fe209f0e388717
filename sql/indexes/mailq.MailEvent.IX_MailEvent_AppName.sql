/*
IX_MailEvent_AppName: mailq.GetMailEvents @AppName: events after the cursor in
one range seek; Detail by key lookup (at most @MaxEvents).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailEvent_AppName' AND object_id = OBJECT_ID(N'mailq.MailEvent')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailEvent_AppName
    ON mailq.MailEvent (AppName ASC, EventSeq ASC)
    INCLUDE (MailID, EventType, Status, AttemptCount, SmtpCode, OccurredAtUtc);
END;
