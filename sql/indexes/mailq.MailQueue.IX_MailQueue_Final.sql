/*
IX_MailQueue_Final: mailq.PurgeMail and reports of finished mail.  Keys
(DateProcessed, ID), INCLUDE (Status, AccountName), filtered to the final
statuses: a purge batch is a range seek on the oldest rows.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Final' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailQueue_Final
    ON mailq.MailQueue (DateProcessed ASC, ID ASC)
    INCLUDE (Status, AccountName)
    WHERE Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped');
END;
