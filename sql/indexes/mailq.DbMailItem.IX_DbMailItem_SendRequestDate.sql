/*
IX_DbMailItem_SendRequestDate: the sysmail_* views' send_request_date filter as a seek.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_DbMailItem_SendRequestDate' AND object_id = OBJECT_ID(N'mailq.DbMailItem')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_DbMailItem_SendRequestDate
    ON mailq.DbMailItem (SendRequestDate)
    INCLUDE (MailID);
END;
