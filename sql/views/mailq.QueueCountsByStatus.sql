/*
mailq.QueueCountsByStatus: how many mails each account has in each status.
Plan: an ordered scan of IX_MailQueue_Status + aggregate, never PK_MailQueue
(tests/integration/test_mailq_view_plans.py).
*/
CREATE OR ALTER VIEW mailq.QueueCountsByStatus
AS
SELECT
    q.Status,
    q.AccountName,
    COUNT_BIG(*) AS MailCount
FROM mailq.MailQueue AS q
GROUP BY q.Status, q.AccountName;
