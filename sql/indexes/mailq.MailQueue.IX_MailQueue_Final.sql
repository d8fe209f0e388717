/*
IX_MailQueue_Final serves mailq.PurgeMail and the reporting of finished
mail: final statuses ordered by DateProcessed, so a purge batch is a range
seek on the oldest rows instead of a scan of the queue.  'Stopped' joined
the filter in revision 0011 (sql/upgrades/mailq.0011.MailQueue.sql rebuilds
the index of an existing database).
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
