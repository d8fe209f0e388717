/*
mailq.PurgeBounceReports: deletes bounce, complaint and unsubscribe reports
(mailq.BounceReport) older than @OlderThanDays days, @BatchSize rows per
transaction, oldest first (a range of IX_BounceReport_ReceivedAtUtc).  The
suppressions they caused stay; the hard/soft bounce counts of
mailq.RecordBounce then count only what is kept, so the retention is also
the window of those counts (docs/bounces.md).
Parameters:  @OlderThanDays INT 1-36500, required; @BatchSize INT 1-1000, default 1000.
Result set:  one row: PurgedCount BIGINT.
Errors:      50615 @OlderThanDays out of range; 50616 @BatchSize out of range;
             50617 called inside a transaction.
Transaction: must not be called inside one (50617): each batch commits on its
             own; an error rolls back the current batch only and is re-raised.
Isolation:   sets READ COMMITTED itself.  Batches of at most 1,000 rows stay
             far below the 5,000 locks of lock escalation.
Lock order:  mailq.BounceReport only.
Example:     EXEC mailq.PurgeBounceReports @OlderThanDays = 365;
*/
CREATE OR ALTER PROCEDURE mailq.PurgeBounceReports
    @OlderThanDays INT,
    @BatchSize INT = 1000
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @OlderThanDays IS NULL OR @OlderThanDays NOT BETWEEN 1 AND 36500
    BEGIN
        SET @Msg = CONCAT(N'@OlderThanDays must be 1-36500; got ',
            COALESCE(CAST(@OlderThanDays AS NVARCHAR(12)), N'NULL'), N'.');
        THROW 50615, @Msg, 1;
    END;
    SET @BatchSize = ISNULL(@BatchSize, 1000);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50616, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50617, N'mailq.PurgeBounceReports commits batch by batch: call it outside a transaction.', 1;
    DECLARE @Cutoff DATETIME2(3) = DATEADD(DAY, -@OlderThanDays, SYSUTCDATETIME());
    DECLARE @Purged BIGINT = 0;
    DECLARE @Deleted INT = 1;
    WHILE @Deleted > 0
    BEGIN
        BEGIN TRY
            BEGIN TRANSACTION;
            WITH Oldest AS (
                SELECT TOP (@BatchSize) b.ReportKey, b.Address, b.ReceivedAtUtc
                FROM mailq.BounceReport AS b
                WHERE b.ReceivedAtUtc < @Cutoff
                ORDER BY b.ReceivedAtUtc
            )

            DELETE FROM Oldest;
            SET @Deleted = @@ROWCOUNT;
            SET @Purged += @Deleted;
            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;
    END;
    SELECT @Purged AS PurgedCount;
END;
