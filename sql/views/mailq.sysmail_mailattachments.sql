/*
mailq.sysmail_mailattachments: msdb.dbo.sysmail_mailattachments over the queue:
a SendDbMail query's result file, msdb's columns in msdb's order; attachment_id
BIGINT = MailItemID * 10 + number - 1; rows as mailq.sysmail_allitems
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-mailattachments-transact-sql).
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
