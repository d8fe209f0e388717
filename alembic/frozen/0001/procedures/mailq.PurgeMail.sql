/*
mailq.PurgeMail: deletes finished mail (Sent, Failed, Cancelled, Expired)
whose DateProcessed is older than @OlderThanDays days, with its attachments
and attempts.  Works in batches of @BatchSize mails, one short transaction
per batch, and deletes children in statements of at most 1000 rows: SQL
Server escalates to a table lock when one statement takes about 5,000 locks
on one table, so no statement here comes near that and the queue stays
available to the workers while a purge runs.  Rows locked by others are
skipped (READPAST) and picked up by the next purge.
Parameters:  @OlderThanDays INT >= 0, required; @BatchSize INT 1-1000, default 500.
Result set:  one row: PurgedCount BIGINT.
Errors:      50135 @OlderThanDays missing or negative; 50140 @BatchSize out of range.
Transaction: must not be called inside a transaction (50141): each batch
             commits on its own, which is the point.
Example:     EXEC mailq.PurgeMail @OlderThanDays = 30;
*/
CREATE OR ALTER PROCEDURE mailq.PurgeMail
    @OlderThanDays INT,
    @BatchSize INT = 500
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @OlderThanDays IS NULL OR @OlderThanDays < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@OlderThanDays must be 0 or more; got ', COALESCE(CAST(@OlderThanDays AS NVARCHAR(12)), N'NULL'), N'.'
        );
        THROW 50135, @Msg, 1;
    END;
    SET @BatchSize = COALESCE(@BatchSize, 500);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50140, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50141, N'mailq.PurgeMail commits batch by batch: call it outside a transaction.', 1;

    DECLARE @Cutoff DATETIME2(3) = DATEADD(DAY, -@OlderThanDays, SYSUTCDATETIME());
    DECLARE @Purged BIGINT = 0;
    DECLARE @Batch TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Deleted INT;

    WHILE 1 = 1
    BEGIN
        DELETE FROM @Batch;
        BEGIN TRY
            BEGIN TRANSACTION;

            -- IX_MailQueue_Final: a range seek on the oldest finished mail.
            -- UPDLOCK, READPAST, ROWLOCK: lock the batch, skip rows others hold.
            INSERT INTO @Batch (ID)
            SELECT TOP (@BatchSize) q.ID
            FROM mailq.MailQueue AS q WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired')
                AND q.DateProcessed < @Cutoff
            ORDER BY q.DateProcessed ASC, q.ID ASC;

            IF @@ROWCOUNT = 0
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) a
                FROM mailq.MailAttachment AS a
                WHERE a.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;

            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) t
                FROM mailq.MailAttempt AS t
                WHERE t.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;

            DELETE q
            FROM mailq.MailQueue AS q
            WHERE q.ID IN (SELECT b.ID FROM @Batch AS b);
            SET @Purged += @@ROWCOUNT;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;
    END;

    SELECT @Purged AS PurgedCount;
END;
