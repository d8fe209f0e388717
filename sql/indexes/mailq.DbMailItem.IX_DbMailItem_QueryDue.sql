/*
IX_DbMailItem_QueryDue: the queries a runner may take (mailq.ClaimDbMailQuery), one
range on QueryDueAtUtc; filtered, so finished items cost nothing.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_DbMailItem_QueryDue' AND object_id = OBJECT_ID(N'mailq.DbMailItem')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_DbMailItem_QueryDue
    ON mailq.DbMailItem (QueryDueAtUtc, MailItemID)
    INCLUDE (QueryState)
    WHERE QueryState IN (N'Pending', N'Running');
END;
