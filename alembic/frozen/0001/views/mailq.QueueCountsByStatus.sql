/*
mailq.QueueCountsByStatus: how many mails each account has in each status.
Counts the whole table: meant for dashboards and `mailq-db stats`, not for a
tight loop (finished mail is purged by mailq.PurgeMail).
*/
CREATE OR ALTER VIEW mailq.QueueCountsByStatus
AS
SELECT
    q.Status,
    q.AccountName,
    COUNT_BIG(*) AS MailCount
FROM mailq.MailQueue AS q
GROUP BY q.Status, q.AccountName;
