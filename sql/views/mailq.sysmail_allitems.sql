/*
mailq.sysmail_allitems: msdb.dbo.sysmail_allitems's columns (names and types
as documented,
https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-allitems-transact-sql)
over this queue, so that a monitoring query written for Database Mail runs
here by changing msdb.dbo to mailq.  Lower-case names on purpose: they are
Database Mail's.
Rows:        every mail of the queue.  db_owner and MailqAdmin members see all
             of them; anybody else only the mail they sent through
             mailq.SendDbMail (as in msdb, where only sysadmin sees all).
Mapping:     mailitem_id = MailQueue.ID (NULL above 2,147,483,647);
             sent_status: Sent -> sent; Failed, Cancelled, Expired, Stopped -> failed;
             UnSent or Sending after a failed attempt -> retrying; else unsent.
             Dates are the server's local time (datetime, as msdb shows them):
             the queue's UTC times plus the server's current UTC offset.
             Text columns keep the documented types: body, recipients and query
             are varchar(max) there, so characters outside the database's code
             page show as '?'; mailq.MailQueue keeps the Unicode original.
             profile_id and the query columns come from mailq.DbMailItem (NULL
             for mail queued by mailq.EnqueueMail); file_attachments lists
             the mail's attachment file names; sent_account_id is the
             account's mailq.DbMailAccount ID (NULL for an account in no profile).
*/
CREATE OR ALTER VIEW mailq.sysmail_allitems
AS
-- The server's current offset from UTC (SYSDATETIME is local time; on Azure
-- SQL Database both are UTC).  SQL Server 2019 has no CURRENT_TIMEZONE_ID, so
-- rows from the other side of a daylight-saving change are an hour off.
WITH Clock AS (
    SELECT DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()) AS OffsetMinutes
)

SELECT
    CAST(IIF(q.ID <= 2147483647, q.ID, NULL) AS INT) AS mailitem_id,
    i.ProfileID AS profile_id,
    CAST(q.ToAddress AS VARCHAR(MAX)) AS recipients,
    CAST(q.CC AS VARCHAR(MAX)) AS copy_recipients,
    CAST(q.BCC AS VARCHAR(MAX)) AS blind_copy_recipients,
    CAST(q.Subject AS NVARCHAR(510)) AS subject,
    CAST(q.Body AS VARCHAR(MAX)) AS body,
    CAST(UPPER(q.BodyFormat) AS VARCHAR(20)) AS body_format,
    CAST(COALESCE(i.Importance, 'NORMAL') AS VARCHAR(6)) AS importance,
    CAST(COALESCE(i.Sensitivity, 'NORMAL') AS VARCHAR(12)) AS sensitivity,
    CAST(f.FileNames AS VARCHAR(MAX)) AS file_attachments,
    CAST('MIME' AS VARCHAR(20)) AS attachment_encoding,
    CAST(i.Query AS VARCHAR(MAX)) AS query,
    CAST(i.ExecuteQueryDatabase AS SYSNAME) AS execute_query_database,
    i.AttachQueryResultAsFile AS attach_query_result_as_file,
    i.QueryResultHeader AS query_result_header,
    i.QueryResultWidth AS query_result_width,
    CAST(i.QueryResultSeparator AS CHAR(1)) AS query_result_separator,
    i.ExcludeQueryOutput AS exclude_query_output,
    i.AppendQueryError AS append_query_error,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, q.dtStamp) AS DATETIME) AS send_request_date,
    CAST(i.SendRequestUser AS SYSNAME) AS send_request_user,
    da.AccountID AS sent_account_id,
    CAST(
        CASE
            WHEN q.Status = N'Sent' THEN 'sent'
            WHEN q.Status IN (N'Failed', N'Cancelled', N'Expired', N'Stopped') THEN 'failed'
            WHEN q.AttemptCount > 0 AND q.LastError IS NOT NULL THEN 'retrying'
            ELSE 'unsent'
        END AS VARCHAR(8)
    ) AS sent_status,
    CAST(
        IIF(
            q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped'),
            DATEADD(MINUTE, k.OffsetMinutes, COALESCE(q.SentAtUtc, q.DateProcessed)),
            NULL
        ) AS DATETIME
    ) AS sent_date,
    CAST(
        DATEADD(MINUTE, k.OffsetMinutes, COALESCE(q.DateProcessed, q.dtStamp)) AS DATETIME
    ) AS last_mod_date,
    CAST(i.SendRequestUser AS SYSNAME) AS last_mod_user
FROM mailq.MailQueue AS q
CROSS JOIN Clock AS k
LEFT JOIN mailq.DbMailItem AS i ON q.ID = i.MailID
LEFT JOIN mailq.DbMailAccount AS da ON q.AccountName = da.AccountName
OUTER APPLY (
    SELECT STRING_AGG(CONVERT(NVARCHAR(MAX), t.FileName), N';') WITHIN GROUP (ORDER BY t.AttachmentNo) AS FileNames
    FROM mailq.MailAttachment AS t
    WHERE t.MailID = q.ID
) AS f
WHERE
    IS_MEMBER(N'db_owner') = 1
    OR IS_MEMBER(N'MailqAdmin') = 1
    OR i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME());
