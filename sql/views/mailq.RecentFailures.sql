/*
mailq.RecentFailures: failed attempts of the last 7 days (Retry, Wait, Stop,
Abandoned), with the mail's current status: what went wrong and whether the
mail got through later.
Expected plan shape (checked on 100,000 rows by
tests/integration/test_mailq_view_plans.py): Index Seek on
IX_MailAttempt_EndedAtUtc (range EndedAtUtc >= now - 7 days; Outcome is an
included column, tested as a residual; a Key Lookup fetches ErrorText),
Nested Loops into a Clustered Index Seek of PK_MailQueue by ID for
AccountName and Status (or, when many attempts are recent, a hash join with
a scan of the narrow IX_MailQueue_Status, whose rows carry ID); never a scan
of mailq.MailAttempt nor of MailQueue's clustered rows.
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
