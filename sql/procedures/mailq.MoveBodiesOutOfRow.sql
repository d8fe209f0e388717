/*
mailq.MoveBodiesOutOfRow: moves the NVARCHAR(MAX) values (Body, TextBody,
Headers) of mails enqueued before revision 0007 out of the clustered row,
in batches, so that claims, acknowledgements and counts touch narrow rows
(issue 10, point 8).
Why: revision 0007 sets the table option 'large value types out of row' on
mailq.MailQueue.  New values are stored by the option in effect; existing
values move only when they are next written ("When the large value types
out of row option value is changed, existing ... values aren't immediately
converted": sp_tableoption, Remarks), so this procedure writes each value
to itself, @BatchSize mails per transaction, oldest ID first, UnSent and
Sending mails first (the hot rows), then the rest.  Re-running it is
harmless: a value already out of row is rewritten to the same place.
The claim's result set does not change (the columns stay where they are).
Parameters:  @BatchSize INT 1-1000, default 500 (every statement stays far
             below the 5,000 locks that escalate to a table lock);
             @MaxBatches INT >= 1, default NULL (until done): stop after that
             many batches, e.g. to spread the work over several maintenance runs.
Result set:  one row: MovedCount BIGINT, LastID BIGINT (NULL when nothing was left).
Errors:      50140 @BatchSize out of range; 50141 called inside a transaction;
             50166 @MaxBatches below 1.
Transaction: must not be called inside a transaction (50141): each batch
             commits on its own.  An error rolls back the current batch only.
Isolation:   sets READ COMMITTED itself (READPAST skips rows a worker holds;
             they are moved by a later run or by their next update anyway).
Lock order:  mailq.MailQueue only (clustered rows, in ID order).
Example:     EXEC mailq.MoveBodiesOutOfRow @BatchSize = 500;
*/
CREATE OR ALTER PROCEDURE mailq.MoveBodiesOutOfRow
    @BatchSize INT = 500,
    @MaxBatches INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    SET @BatchSize = COALESCE(@BatchSize, 500);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50140, @Msg, 1;
    END;
    IF @MaxBatches < 1
    BEGIN
        SET @Msg = CONCAT(N'@MaxBatches must be 1 or more (NULL: until done); got ', @MaxBatches, N'.');
        THROW 50166, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50141, N'mailq.MoveBodiesOutOfRow commits batch by batch: call it outside a transaction.', 1;

    DECLARE @Moved BIGINT = 0, @Batches INT = 0, @Rows INT;
    DECLARE @LastID BIGINT = 0, @Pass TINYINT = 1;
    DECLARE @Batch TABLE (ID BIGINT NOT NULL PRIMARY KEY);

    -- Pass 1: UnSent and Sending (the rows every claim reads); pass 2: the rest.
    WHILE @Pass <= 2 AND (@MaxBatches IS NULL OR @Batches < @MaxBatches)
    BEGIN
        DELETE FROM @Batch;
        BEGIN TRY
            BEGIN TRANSACTION;

            -- UPDLOCK, READPAST, ROWLOCK: take the batch, skip rows others hold.
            INSERT INTO @Batch (ID)
            SELECT TOP (@BatchSize) q.ID
            FROM mailq.MailQueue AS q WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE
                q.ID > @LastID
                AND (
                    (@Pass = 1 AND q.Status IN (N'UnSent', N'Sending'))
                    OR (@Pass = 2 AND q.Status NOT IN (N'UnSent', N'Sending'))
                )
            ORDER BY q.ID ASC;
            SET @Rows = @@ROWCOUNT;

            -- Writing a value to itself stores it by the table option now in effect.
            UPDATE q
            SET
                q.Body = q.Body,
                q.TextBody = q.TextBody,
                q.Headers = q.Headers
            FROM mailq.MailQueue AS q WITH (ROWLOCK)
            WHERE q.ID IN (SELECT b.ID FROM @Batch AS b);

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;

        IF @Rows = 0
        BEGIN
            SET @Pass += 1;
            SET @LastID = 0;
        END
        ELSE
        BEGIN
            SET @Moved += @Rows;
            SET @Batches += 1;
            SELECT @LastID = MAX(b.ID) FROM @Batch AS b;
        END;
    END;

    SELECT
        @Moved AS MovedCount,
        IIF(@Pass > 2, CAST(NULL AS BIGINT), @LastID) AS LastID;
END;
