/*
mailq.QueueCountsByStatus: how many mails each account has in each status.
Expected plan shape (checked on 100,000 rows by
tests/integration/test_mailq_view_plans.py): Index Scan of
IX_MailQueue_Status (Status, AccountName, VisibleAtUtc), ordered, feeding a
Stream Aggregate (or a Hash Match aggregate); no Sort over the table, no Key
Lookup, no access to PK_MailQueue: the count never reads a row that carries
a body.  Reads only; run under READ_COMMITTED_SNAPSHOT it takes no lock.
*/
CREATE OR ALTER VIEW mailq.QueueCountsByStatus
AS
SELECT
    q.Status,
    q.AccountName,
    COUNT_BIG(*) AS MailCount
FROM mailq.MailQueue AS q
GROUP BY q.Status, q.AccountName;
