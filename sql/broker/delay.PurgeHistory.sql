/*
delay.PurgeHistory: deletes final tasks (Done, Failed, Refused, Cancelled, receipt
written) that finished before the cutoff, with their keys, and delay.Log rows logged
before it: @BatchSize rows per short transaction, at most @MaxBatches per call (run
it from the Agent job).  The platform's rows are never deleted.
Parameters:  @OlderThanDays INT = NULL (delay.Setting.RetentionDays) 1-3650;
             @BatchSize INT = 1000 (1-10000); @MaxBatches INT = 100 (1-100000)
Result set:  one row: TasksDeleted BIGINT, LogRowsDeleted BIGINT, Finished BIT (0: run it again)
Errors:      50543 called inside a transaction, or a parameter out of range.  Transaction: one per batch.
Lock order:  delay.Task (IX_Task_FinishedAtUtc order), delay.TaskKey; then delay.Log.  Isolation: READ COMMITTED.
Security:    granted to MailqAdmin.
Example:     EXEC delay.PurgeHistory @OlderThanDays = 30;
*/
CREATE OR ALTER PROCEDURE delay.PurgeHistory
    @OlderThanDays INT = NULL,
    @BatchSize INT = 1000,
    @MaxBatches INT = 100
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET IMPLICIT_TRANSACTIONS OFF;   -- before the first read: else it opens one (pyodbc, JDBC) and 50543 always
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048), @Cutoff DATETIME2(3), @Tasks BIGINT = 0, @Logs BIGINT = 0, @Batches INT = 0,
        @Done INT = 0, @LogDone INT = 0;
    DECLARE @Gone TABLE (TaskID BIGINT NOT NULL PRIMARY KEY);
    SELECT @OlderThanDays = ISNULL(@OlderThanDays, s.RetentionDays) FROM delay.Setting AS s WHERE s.SettingId = 1;
    IF @@TRANCOUNT > 0 OR ISNULL(@OlderThanDays, 0) NOT BETWEEN 1 AND 3650
        OR ISNULL(@BatchSize, 0) NOT BETWEEN 1 AND 10000 OR ISNULL(@MaxBatches, 0) NOT BETWEEN 1 AND 100000
    BEGIN
        SET @Msg = CONCAT(N'delay.PurgeHistory runs outside a transaction with @OlderThanDays 1-3650, @BatchSize ',
            N'1-10000, @MaxBatches 1-100000; got ', @@TRANCOUNT, N' open, ', @OlderThanDays, N', ', @BatchSize, N', ',
            @MaxBatches, N'.');
        THROW 50543, @Msg, 1;
    END;
    SET @Cutoff = DATEADD(DAY, -@OlderThanDays, SYSUTCDATETIME());
    WHILE @Batches < @MaxBatches
    BEGIN
        SET @Batches += 1;
        DELETE FROM @Gone;
        BEGIN TRANSACTION;
        DELETE TOP (@BatchSize) t
        OUTPUT deleted.TaskID INTO @Gone (TaskID)
        FROM delay.Task AS t WITH (INDEX (IX_Task_FinishedAtUtc))
        WHERE t.FinishedAtUtc < @Cutoff AND t.TaskState IN (N'Done', N'Failed', N'Refused', N'Cancelled')
            AND NOT EXISTS (SELECT 1 FROM delay.ReceiptDue AS r WHERE r.TaskID = t.TaskID);
        SET @Done = @@ROWCOUNT;
        DELETE k FROM delay.TaskKey AS k INNER JOIN @Gone AS g ON k.TaskID = g.TaskID;
        COMMIT TRANSACTION;
        -- LogId grows with LoggedAtUtc: the oldest rows first, a bounded read from the clustered start.
        WITH Oldest AS (SELECT TOP (@BatchSize) l.LogId, l.LoggedAtUtc FROM delay.Log AS l ORDER BY l.LogId)

        DELETE FROM Oldest WHERE LoggedAtUtc < @Cutoff;
        SELECT @LogDone = @@ROWCOUNT, @Tasks += @Done;
        SET @Logs += @LogDone;
        IF @Done < @BatchSize AND @LogDone < @BatchSize BREAK;
    END;
    SELECT @Tasks AS TasksDeleted, @Logs AS LogRowsDeleted,
        CAST(IIF(@Done < @BatchSize AND @LogDone < @BatchSize, 1, 0) AS BIT) AS Finished;
END;
