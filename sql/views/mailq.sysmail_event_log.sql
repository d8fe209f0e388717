/*
mailq.sysmail_event_log: msdb.dbo.sysmail_event_log's columns (as documented,
https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-event-log-transact-sql)
over the queue's attempt history (mailq.MailAttempt): one row per finished
attempt.
Mapping:     event_type: Sent, DryRun -> success; Retry, Wait, Released,
             Abandoned -> warning; Stop -> error.  description: the outcome,
             the SMTP code and the error text.  log_id numbers the rows by
             time (it changes when mailq.PurgeMail deletes older ones: do
             not keep it).  process_id is NULL (workers are not one process);
             last_mod_user is the worker's name.  Dates as in sysmail_allitems.
Rows:        db_owner and MailqAdmin members see all; others the attempts of
             mail they sent through mailq.SendDbMail.
*/
CREATE OR ALTER VIEW mailq.sysmail_event_log
AS
-- The server's current offset from UTC (SYSDATETIME is local time; on Azure
-- SQL Database both are UTC).  SQL Server 2019 has no CURRENT_TIMEZONE_ID, so
-- rows from the other side of a daylight-saving change are an hour off.
WITH Clock AS (
    SELECT DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()) AS OffsetMinutes
)

SELECT
    CAST(ROW_NUMBER() OVER (ORDER BY t.EndedAtUtc, t.MailID, t.AttemptNo) AS INT) AS log_id,
    CAST(
        CASE
            WHEN t.Outcome IN (N'Sent', N'DryRun') THEN 'success'
            WHEN t.Outcome = N'Stop' THEN 'error'
            ELSE 'warning'
        END AS VARCHAR(11)
    ) AS event_type,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, t.EndedAtUtc) AS DATETIME) AS log_date,
    CAST(
        CONCAT(
            N'Attempt ', t.AttemptNo, N': ', t.Outcome,
            IIF(t.SmtpCode IS NULL, N'', CONCAT(N' (SMTP ', t.SmtpCode, N')')),
            IIF(t.ErrorText IS NULL, N'', CONCAT(N': ', t.ErrorText))
        ) AS NVARCHAR(MAX)
    ) AS description,
    CAST(NULL AS INT) AS process_id,
    CAST(IIF(t.MailID <= 2147483647, t.MailID, NULL) AS INT) AS mailitem_id,
    da.AccountID AS account_id,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, t.EndedAtUtc) AS DATETIME) AS last_mod_date,
    CAST(t.WorkerName AS SYSNAME) AS last_mod_user
FROM mailq.MailAttempt AS t
CROSS JOIN Clock AS k
INNER JOIN mailq.MailQueue AS q ON t.MailID = q.ID
LEFT JOIN mailq.DbMailItem AS i ON q.ID = i.MailID
LEFT JOIN mailq.DbMailAccount AS da ON q.AccountName = da.AccountName
WHERE
    t.EndedAtUtc IS NOT NULL
    AND (
        IS_MEMBER(N'db_owner') = 1
        OR IS_MEMBER(N'MailqAdmin') = 1
        OR i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME())
    );
