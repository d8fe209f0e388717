/*
IX_MailQueue_Status: the narrow, unfiltered index the counts read (QueueCountsByStatus,
OldestDueMail), never the clustered index.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Status' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailQueue_Status
    ON mailq.MailQueue (Status ASC, AccountName ASC, VisibleAtUtc ASC);
END;
