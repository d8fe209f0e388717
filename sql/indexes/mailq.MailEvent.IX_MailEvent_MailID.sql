/*
IX_MailEvent_MailID: mailq.GetMailEvents @MailID and mailq.PurgeMail (a seek per mail).
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
