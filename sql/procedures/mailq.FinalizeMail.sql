/*
mailq.FinalizeMail: in small batches, moves mail that can never be sent to Failed (no attempt
left, last lease expired) or Expired (past ExpiresAtUtc, no live lease), so the claim never has to.
Parameters:  @BatchSize INT 1-1000, default 200 (per statement); @MaxBatches INT 1-1000, default 50
Result set:  FailedCount, ExpiredCount, MoreLeft BIT (call again), Busy BIT (another finalizer ran)
Errors:      50150 @BatchSize, 50151 @MaxBatches out of range; 50152 called inside a transaction.
Transaction: refuses one (50152); each batch commits on its own, also in implicit transaction
             mode (turned off inside); an error rolls back the batch under way and is re-raised.
Isolation:   sets READ COMMITTED (READPAST needs it).  Example: EXEC mailq.FinalizeMail @BatchSize = 200;
Lock order:  the application lock N'mailq.FinalizeMail' (batch-owned, never waited for), then
             mailq.MailQueue (keys U, rows X), mailq.MailAttempt, mailq.MailEvent (docs/finalization.md).
*/
CREATE OR ALTER PROCEDURE mailq.FinalizeMail
    @BatchSize INT = 200,
    @MaxBatches INT = 50
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- Off before any statement: under IMPLICIT_TRANSACTIONS ON no batch would commit.
    SET IMPLICIT_TRANSACTIONS OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @BatchSize = COALESCE(@BatchSize, 200);
    SET @MaxBatches = COALESCE(@MaxBatches, 50);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50150, @Msg, 1;
    END;
    IF @MaxBatches NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@MaxBatches must be 1-1000; got ', @MaxBatches, N'.');
        THROW 50151, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50152, N'mailq.FinalizeMail commits batch by batch: call it outside a transaction.', 1;
    DECLARE @Done TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        NewStatus NVARCHAR(16) NOT NULL,
        OldStatus NVARCHAR(16) NOT NULL,
        OldLockToken UNIQUEIDENTIFIER NULL,
        AppName NVARCHAR(128) NULL,
        AttemptCount INT NOT NULL,
        LastError NVARCHAR(4000) NULL
    );
    DECLARE @Now DATETIME2(3);
    DECLARE @Failed INT = 0;
    DECLARE @Expired INT = 0;
    DECLARE @Rows INT;
    DECLARE @ExpiredRows INT;
    DECLARE @Batches INT = 0;
    DECLARE @MoreLeft BIT = 0;
    DECLARE @Busy BIT = 0;
    DECLARE @Lock INT;
    WHILE @Batches < @MaxBatches
    BEGIN
        SET @Batches += 1;
        SET @Now = SYSUTCDATETIME();
        DELETE FROM @Done;
        BEGIN TRY
            BEGIN TRANSACTION;
            -- One finalizer at a time (the two reads below in opposite orders could deadlock).
            EXEC @Lock = sys.sp_getapplock
                @Resource = N'mailq.FinalizeMail', @LockMode = N'Exclusive',
                @LockOwner = N'Transaction', @LockTimeout = 0;
            IF @Lock < 0
            BEGIN
                ROLLBACK TRANSACTION;  -- nothing written in it
                SET @Busy = 1;
                BREAK;
            END;
            -- Out of attempts.  READPAST: skip rows others hold; UPDLOCK, ROWLOCK: claim while reading.
            WITH Dead AS (
                SELECT TOP (@BatchSize)
                    q.ID,
                    q.Status,
                    q.ThreadLock,
                    q.PossibleDuplicate,
                    q.DateProcessed,
                    q.LastError,
                    q.AppName,
                    q.AttemptCount
                FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Finalize), READPAST, UPDLOCK, ROWLOCK)
                WHERE
                    q.Status IN (N'UnSent', N'Sending')
                    AND q.AttemptsRemaining = 0
                    AND q.VisibleAtUtc <= @Now
                ORDER BY q.VisibleAtUtc ASC, q.ID ASC
            )

            UPDATE d
            SET
                d.Status = N'Failed',
                d.ThreadLock = NULL,
                d.PossibleDuplicate = IIF(d.Status = N'Sending', CAST(1 AS BIT), d.PossibleDuplicate),
                d.DateProcessed = @Now,
                d.LastError = LEFT(CONCAT(N'No attempt left after an abandoned lease. Last error: ', d.LastError), 4000)
            OUTPUT
                inserted.ID, inserted.Status, deleted.Status, deleted.ThreadLock,
                inserted.AppName, inserted.AttemptCount, inserted.LastError
            INTO @Done (ID, NewStatus, OldStatus, OldLockToken, AppName, AttemptCount, LastError)
            FROM Dead AS d;
            SET @Rows = @@ROWCOUNT;
            SET @Failed += @Rows;
            WITH Late AS (
                SELECT TOP (@BatchSize)
                    q.ID,
                    q.Status,
                    q.ThreadLock,
                    q.PossibleDuplicate,
                    q.DateProcessed,
                    q.LastError,
                    q.AppName,
                    q.AttemptCount
                FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Expiry), READPAST, UPDLOCK, ROWLOCK)
                WHERE
                    q.Status IN (N'UnSent', N'Sending')
                    AND q.ExpiresAtUtc IS NOT NULL
                    AND q.ExpiresAtUtc <= @Now
                    AND (q.Status = N'UnSent' OR q.VisibleAtUtc <= @Now)
                ORDER BY q.ExpiresAtUtc ASC, q.ID ASC
            )

            UPDATE l
            SET
                l.Status = N'Expired',
                l.ThreadLock = NULL,
                l.PossibleDuplicate = IIF(l.Status = N'Sending', CAST(1 AS BIT), l.PossibleDuplicate),
                l.DateProcessed = @Now,
                l.LastError = N'Expired before it could be sent (ExpiresAtUtc passed).'
            OUTPUT
                inserted.ID, inserted.Status, deleted.Status, deleted.ThreadLock,
                inserted.AppName, inserted.AttemptCount, inserted.LastError
            INTO @Done (ID, NewStatus, OldStatus, OldLockToken, AppName, AttemptCount, LastError)
            FROM Late AS l;
            SET @ExpiredRows = @@ROWCOUNT;
            SET @Expired += @ExpiredRows;
            IF @ExpiredRows > @Rows SET @Rows = @ExpiredRows;
            UPDATE t
            SET
                t.EndedAtUtc = @Now,
                t.Outcome = N'Abandoned',
                t.ErrorText = IIF(
                    d.NewStatus = N'Failed',
                    N'Lease expired before the worker acknowledged; no attempt left.',
                    N'Lease expired before the worker acknowledged; the mail expired.'
                )
            FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)
            INNER JOIN @Done AS d
                ON t.MailID = d.ID AND t.LockToken = d.OldLockToken
            WHERE d.OldStatus = N'Sending' AND t.EndedAtUtc IS NULL;
            INSERT INTO mailq.MailEvent (
                MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc
            )
            SELECT
                d.ID, d.AppName, N'LeaseExpired', N'Sending', d.AttemptCount, NULL,
                N'Lease expired before the worker acknowledged.', @Now
            FROM @Done AS d
            WHERE d.OldStatus = N'Sending';
            INSERT INTO mailq.MailEvent (
                MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc
            )
            SELECT
                d.ID,
                d.AppName,
                d.NewStatus AS EventType,
                d.NewStatus AS Status,
                d.AttemptCount,
                NULL,
                d.LastError,
                @Now
            FROM @Done AS d;
            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;
        IF @Rows < @BatchSize
        BEGIN
            SET @MoreLeft = 0;
            BREAK;
        END;
        SET @MoreLeft = 1;
    END;
    SELECT @Failed AS FailedCount, @Expired AS ExpiredCount, @MoreLeft AS MoreLeft, @Busy AS Busy;
END;
