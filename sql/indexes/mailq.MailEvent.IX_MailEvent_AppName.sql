/*
IX_MailEvent_AppName serves mailq.GetMailEvents @AppName: keys (AppName,
EventSeq), so "this application's events after the cursor, in order" is one
range seek whatever the size of the table, and TOP (@MaxEvents) stops it.
The narrow columns are included; Detail comes by a key lookup per row
returned (at most @MaxEvents).
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
