/*
mailq.ThroughputPerHour: attempts finished per UTC hour and account over the
last 48 hours: Sent (Sent and DryRun outcomes) and Failed (Retry, Wait, Stop,
Abandoned outcomes).
Expected plan shape (checked on 100,000 rows by
tests/integration/test_mailq_view_plans.py): Index Seek on
IX_MailAttempt_EndedAtUtc (range EndedAtUtc >= now - 48 hours), a join to
PK_MailQueue by ID (Nested Loops with a Clustered Index Seek, or a hash join
with a scan of the narrow IX_MailQueue_Status when many attempts are
recent), then an aggregate by hour and account; never a scan of
mailq.MailAttempt nor of MailQueue's clustered rows.
*/
CREATE OR ALTER VIEW mailq.ThroughputPerHour
AS
WITH RecentAttempt AS (
    SELECT
        t.MailID,
        t.Outcome,
        DATEADD(HOUR, DATEDIFF(HOUR, '20000101', t.EndedAtUtc), CAST('20000101' AS DATETIME2(0))) AS HourUtc
    FROM mailq.MailAttempt AS t
    WHERE t.EndedAtUtc >= DATEADD(HOUR, -48, SYSUTCDATETIME())
)

SELECT
    r.HourUtc,
    q.AccountName,
    SUM(IIF(r.Outcome IN (N'Sent', N'DryRun'), 1, 0)) AS Sent,
    SUM(IIF(r.Outcome IN (N'Retry', N'Wait', N'Stop', N'Abandoned'), 1, 0)) AS Failed
FROM RecentAttempt AS r
INNER JOIN mailq.MailQueue AS q ON r.MailID = q.ID
GROUP BY r.HourUtc, q.AccountName;
