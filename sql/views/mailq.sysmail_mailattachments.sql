/*
mailq.sysmail_mailattachments: msdb.dbo.sysmail_mailattachments over this
queue: the attachments of mail sent with mailq.SendDbMail (here only a
query's result file), msdb's columns in msdb's order
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-mailattachments-transact-sql).
attachment_id is BIGINT here (MailItemID * 10 + the attachment's number - 1:
a mail has at most 10); rows as mailq.sysmail_allitems.
*/
CREATE OR ALTER VIEW mailq.sysmail_mailattachments
AS
SELECT
    CAST(i.MailItemID AS BIGINT) * 10 + a.AttachmentNo - 1 AS attachment_id,
    i.MailItemID AS mailitem_id,
    CAST(a.FileName AS NVARCHAR(260)) AS filename,
    CAST(DATALENGTH(a.Content) AS INT) AS filesize,
    a.Content AS attachment,
    i.SendRequestDate AS last_mod_date,
    CAST(i.SendRequestUser AS SYSNAME) AS last_mod_user
FROM mailq.DbMailItem AS i
INNER JOIN mailq.MailAttachment AS a ON i.MailID = a.MailID
WHERE
    IS_MEMBER(N'db_owner') = 1
    OR IS_MEMBER(N'MailqAdmin') = 1
    OR i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME());
