/*
IX_BounceReport_Address: the bounce count of one address on one account
(mailq.RecordBounce compares it with @HardBounceLimit / @SoftBounceLimit):
one seek on (AccountName, Address, Kind).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_BounceReport_Address' AND object_id = OBJECT_ID(N'mailq.BounceReport')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_BounceReport_Address
    ON mailq.BounceReport (AccountName ASC, Address ASC, Kind ASC) INCLUDE (MailID);
END;
