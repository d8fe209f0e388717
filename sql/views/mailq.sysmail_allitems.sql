/*
mailq.sysmail_allitems: msdb.dbo.sysmail_allitems over this queue: one row per
mailq.SendDbMail call, msdb's 27 columns in msdb's order, text as Unicode
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-allitems-transact-sql).
Rows:        db_owner and MailqAdmin members see all; others what they sent.
Mapping:     sent_status: Sent -> sent; Failed, Cancelled, Expired, Stopped ->
             failed; UnSent or Sending after a failed attempt -> retrying; else
             unsent.  sent_date and last_mod_date: UTC plus the server's current
             offset.  recipients NULL for Cc/Bcc-only mail; file_attachments NULL.
Cost:        mailitem_id and send_request_date filters seek DbMailItem; others
             read the DbMail items only (tests/integration/test_dbmail_views_plan.py).
*/
CREATE OR ALTER VIEW mailq.sysmail_allitems
AS
-- The server's current offset from UTC (0 on Azure SQL Database).
WITH Clock AS (
    SELECT DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()) AS OffsetMinutes
)

SELECT
    i.MailItemID AS mailitem_id,
    i.ProfileID AS profile_id,
    NULLIF(q.ToAddress, N'') AS recipients,
    q.CC AS copy_recipients,
    q.BCC AS blind_copy_recipients,
    CAST(q.Subject AS NVARCHAR(900)) AS subject,
    CAST(q.Body AS NVARCHAR(MAX)) AS body,
    CAST(UPPER(q.BodyFormat) AS NVARCHAR(20)) AS body_format,
    CAST(i.Importance AS NVARCHAR(6)) AS importance,
    CAST(i.Sensitivity AS NVARCHAR(12)) AS sensitivity,
    CAST(NULL AS NVARCHAR(MAX)) AS file_attachments,
    CAST(N'MIME' AS NVARCHAR(20)) AS attachment_encoding,
    CAST(i.Query AS NVARCHAR(MAX)) AS query,
    CAST(i.ExecuteQueryDatabase AS SYSNAME) AS execute_query_database,
    i.AttachQueryResultAsFile AS attach_query_result_as_file,
    i.QueryResultHeader AS query_result_header,
    i.QueryResultWidth AS query_result_width,
    i.QueryResultSeparator AS query_result_separator,
    i.ExcludeQueryOutput AS exclude_query_output,
    i.AppendQueryError AS append_query_error,
    i.SendRequestDate AS send_request_date,
    CAST(i.SendRequestUser AS SYSNAME) AS send_request_user,
    IIF(q.Status = N'Sent', da.AccountID, NULL) AS sent_account_id,
    CAST(
        CASE
            WHEN q.Status = N'Sent' THEN N'sent'
            WHEN q.Status IN (N'Failed', N'Cancelled', N'Expired', N'Stopped') THEN N'failed'
            WHEN q.AttemptCount > 0 AND q.LastError IS NOT NULL THEN N'retrying'
            ELSE N'unsent'
        END AS NVARCHAR(8)
    ) AS sent_status,
    CAST(
        IIF(
            q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped'),
            DATEADD(MINUTE, k.OffsetMinutes, COALESCE(q.SentAtUtc, q.DateProcessed)),
            NULL
        ) AS DATETIME
    ) AS sent_date,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, COALESCE(q.DateProcessed, q.dtStamp)) AS DATETIME) AS last_mod_date,
    CAST(i.SendRequestUser AS SYSNAME) AS last_mod_user
FROM mailq.DbMailItem AS i
INNER JOIN mailq.MailQueue AS q ON i.MailID = q.ID
CROSS JOIN Clock AS k
LEFT JOIN mailq.DbMailAccount AS da ON q.AccountName = da.AccountName
WHERE
    IS_MEMBER(N'db_owner') = 1
    OR IS_MEMBER(N'MailqAdmin') = 1
    OR i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME());
