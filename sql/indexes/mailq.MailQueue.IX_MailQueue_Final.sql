/*
IX_MailQueue_Final: mailq.PurgeMail's range seek on the oldest final mail.
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
