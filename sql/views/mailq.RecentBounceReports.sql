/*
mailq.RecentBounceReports: bounce, complaint and unsubscribe reports of the
last 7 days (a range of IX_BounceReport_ReceivedAtUtc), newest first when
ordered by ReceivedAtUtc DESC; whether each address is suppressed now.
*/
CREATE OR ALTER VIEW mailq.RecentBounceReports
AS
SELECT
    b.ReceivedAtUtc,
    b.AccountName,
    b.AppName,
    b.MailID,
    b.Address,
    b.Kind,
    b.Action,
    b.Status,
    b.SmtpCode,
    b.Detail,
    b.Source,
    CAST(IIF(EXISTS (
        SELECT 1
        FROM mailq.Suppression AS s
        WHERE
            s.AccountName = b.AccountName AND s.Address = b.Address
            AND s.AppName IN (N'', ISNULL(b.AppName, N''))
            AND (s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > SYSUTCDATETIME())
    ), 1, 0) AS BIT) AS Suppressed
FROM mailq.BounceReport AS b
WHERE b.ReceivedAtUtc >= DATEADD(DAY, -7, SYSUTCDATETIME());
