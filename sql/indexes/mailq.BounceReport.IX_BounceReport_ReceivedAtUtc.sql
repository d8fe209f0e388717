/*
IX_BounceReport_ReceivedAtUtc: recent reports by time (mailq.GetSuppressionStats,
the mailq.RecentBounceReports view) and the oldest ones first
(mailq.PurgeBounceReports): a range seek, never a scan of the history.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_BounceReport_ReceivedAtUtc' AND object_id = OBJECT_ID(N'mailq.BounceReport')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_BounceReport_ReceivedAtUtc
    ON mailq.BounceReport (ReceivedAtUtc ASC)
    INCLUDE (AccountName, Kind, MailID);
END;
