/*
mailq.OldestDueMail: per account, the oldest due UnSent mail, its age in seconds
and how many are due; a growing age means the workers fall behind or the account
is blocked.  Plan: a seek on IX_MailQueue_Status (or the covering claim index),
never PK_MailQueue (tests/integration/test_mailq_view_plans.py).
*/
CREATE OR ALTER VIEW mailq.OldestDueMail
AS
SELECT
    q.AccountName,
    MIN(q.VisibleAtUtc) AS OldestDueUtc,
    DATEDIFF_BIG(SECOND, MIN(q.VisibleAtUtc), SYSUTCDATETIME()) AS OldestDueAgeSeconds,
    COUNT_BIG(*) AS DueCount
FROM mailq.MailQueue AS q
WHERE q.Status = N'UnSent' AND q.VisibleAtUtc <= SYSUTCDATETIME()
GROUP BY q.AccountName;
