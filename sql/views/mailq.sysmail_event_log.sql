/*
mailq.sysmail_event_log: msdb.dbo.sysmail_event_log over mailq.MailEvent for mail
sent with mailq.SendDbMail, msdb's columns in msdb's order
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-event-log-transact-sql).
event_type:  success: Sent, DryRun; warning: RetryScheduled, AccountWaiting,
             LeaseExpired, Released; error: Failed, Expired, Stopped by a failed
             query (one error row per finally failed mail, as msdb); information:
             Cancelled, Requeued, other Stopped.
log_id:      the EventID (BIGINT), in commit order: "log_id > @last_seen" polling
             works (docs/events.md).
Rows:        as mailq.sysmail_allitems.  Cost: a seek per item on IX_MailEvent_MailID.
*/
CREATE OR ALTER VIEW mailq.sysmail_event_log
AS
WITH Clock AS (
    SELECT DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()) AS OffsetMinutes
)

SELECT
    CAST(e.EventSeq AS BIGINT) AS log_id,
    CAST(
        CASE
            WHEN e.EventType IN (N'Sent', N'DryRun') THEN N'success'
            WHEN e.EventType IN (N'Failed', N'Expired') THEN N'error'
            WHEN e.EventType = N'Stopped' AND i.QueryState = N'Failed' THEN N'error'
            WHEN e.EventType IN (N'Cancelled', N'Requeued', N'Stopped') THEN N'information'
            ELSE N'warning'
        END AS NVARCHAR(11)
    ) AS event_type,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, e.OccurredAtUtc) AS DATETIME) AS log_date,
    CAST(
        CONCAT(
            e.EventType,
            IIF(e.SmtpCode IS NULL, N'', CONCAT(N' (SMTP ', e.SmtpCode, N')')),
            IIF(e.Detail IS NULL, N'', CONCAT(N': ', e.Detail))
        ) AS NVARCHAR(MAX)
    ) AS description,
    CAST(NULL AS INT) AS process_id,
    i.MailItemID AS mailitem_id,
    da.AccountID AS account_id,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, e.OccurredAtUtc) AS DATETIME) AS last_mod_date,
    CAST(i.SendRequestUser AS SYSNAME) AS last_mod_user
FROM mailq.DbMailItem AS i
INNER JOIN mailq.MailEvent AS e ON i.MailID = e.MailID
INNER JOIN mailq.MailQueue AS q ON i.MailID = q.ID
CROSS JOIN Clock AS k
LEFT JOIN mailq.DbMailAccount AS da ON q.AccountName = da.AccountName
WHERE
    e.EventType NOT IN (N'Enqueued', N'Claimed')
    AND (
        IS_MEMBER(N'db_owner') = 1
        OR IS_MEMBER(N'MailqAdmin') = 1
        OR i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME())
    );
