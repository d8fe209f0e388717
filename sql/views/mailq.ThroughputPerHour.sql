/*
mailq.ThroughputPerHour: attempts finished per UTC hour and account over the last
48 hours: Sent (Sent, DryRun) and Failed (Retry, Wait, Stop, Abandoned).
Plan: a range seek on IX_MailAttempt_EndedAtUtc, PK_MailQueue by ID; never a scan
of either table's clustered rows (tests/integration/test_mailq_view_plans.py).
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
