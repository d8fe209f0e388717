/*
IX_MailEvent_MailID serves mailq.GetMailEvents @MailID (one mail's events
after the cursor: a range seek) and mailq.PurgeMail (a mail's events are
deleted with it: a seek per mail, never a scan of the event history).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailEvent_MailID' AND object_id = OBJECT_ID(N'mailq.MailEvent')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailEvent_MailID
    ON mailq.MailEvent (MailID ASC, EventSeq ASC);
END;
