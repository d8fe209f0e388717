/*
mailq.OldestDueMail: per account, the oldest mail that is due and waiting
(UnSent, VisibleAtUtc passed), its age in seconds and how many are due.  A
growing age means the workers fall behind or the account is blocked.
Expected plan shape (checked on 100,000 rows by
tests/integration/test_mailq_view_plans.py): Index Seek on
IX_MailQueue_Status with the seek predicate Status = N'UnSent' (VisibleAtUtc
<= now as a seek range or residual), Stream Aggregate per AccountName; no
Key Lookup and no access to PK_MailQueue.  The predicate needs no filtered
index to match: IX_MailQueue_Status is unfiltered.  The optimizer may as
well read the claim index (filtered on the claimable statuses, which
Status = N'UnSent' implies, and covering): as narrow, also accepted.
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
