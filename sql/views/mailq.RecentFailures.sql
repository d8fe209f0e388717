/*
mailq.RecentFailures: failed attempts of the last 7 days (Retry, Wait, Stop,
Abandoned) with the mail's current status: did it get through later?
Plan: a range seek on IX_MailAttempt_EndedAtUtc, PK_MailQueue by ID; never a scan
of either table's clustered rows (tests/integration/test_mailq_view_plans.py).
*/
CREATE OR ALTER VIEW mailq.RecentFailures
AS
SELECT
    t.MailID AS ID,
    t.AttemptNo,
    q.AccountName,
    q.Status,
    t.Outcome,
    t.SmtpCode,
    t.ErrorText AS LastError,
    t.EndedAtUtc AS DateProcessed
FROM mailq.MailAttempt AS t
INNER JOIN mailq.MailQueue AS q ON t.MailID = q.ID
WHERE
    t.EndedAtUtc >= DATEADD(DAY, -7, SYSUTCDATETIME())
    AND t.Outcome IN (N'Retry', N'Wait', N'Stop', N'Abandoned');
