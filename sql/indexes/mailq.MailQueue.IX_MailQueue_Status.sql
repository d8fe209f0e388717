/*
IX_MailQueue_Status: the narrow index the counts read.  Keys (Status,
AccountName, VisibleAtUtc), no INCLUDE, unfiltered (a view's Status predicate
never has to match a filter).  mailq.QueueCountsByStatus scans it in key
order (Stream Aggregate, no Sort, never the clustered index);
mailq.OldestDueMail seeks Status = 'UnSent'.
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
