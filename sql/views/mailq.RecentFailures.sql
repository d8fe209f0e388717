/*
mailq.RecentFailures: failed attempts of the last 7 days (Retry, Wait, Stop,
Abandoned), with the mail's current status: what went wrong and whether the
mail got through later.
Expected plan shape (checked on 100,000 rows by
tests/integration/test_mailq_view_plans.py): Index Seek on
IX_MailAttempt_EndedAtUtc (range EndedAtUtc >= now - 7 days; Outcome is an
included column, tested as a residual), Nested Loops into a Clustered Index
Seek of PK_MailQueue by ID for AccountName and Status; no scan of either
table.  The clustered row is narrow once bodies are stored out of row.
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
