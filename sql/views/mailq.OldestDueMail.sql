/*
mailq.OldestDueMail: per account, the oldest mail that is due and waiting
(UnSent, VisibleAtUtc passed), its age in seconds and how many are due.  A
growing age means the workers fall behind or the account is blocked.
Served by IX_MailQueue_Claim (its filter contains Status = N'UnSent').
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
