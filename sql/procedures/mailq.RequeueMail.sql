/*
mailq.RequeueMail: puts a Failed, Cancelled, Expired or Stopped mail back in the
queue (UnSent) with fresh attempts; PossibleDuplicate and the attempt history are
kept.  An expiry not after the new due time is cleared.
Parameters:  @ID BIGINT, required; @MaxAttempts INT 1-20 = 5; @DateToProcess UTC = now
Result set:  one row: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50136 @ID missing; 50119 @MaxAttempts out of range; 50201 unknown mail; 50205 not
             Failed, Cancelled, Expired or Stopped; 50600 every recipient is suppressed (others: left out).
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK check-then-update).
Lock order:  mailq.Suppression (key ranges, held: docs/bounces.md), mailq.MailQueue (the
             clustered row), then mailq.MailEvent (insert).
Example:     EXEC mailq.RequeueMail @ID = 101, @MaxAttempts = 3;
*/
CREATE OR ALTER PROCEDURE mailq.RequeueMail
    @ID BIGINT,
    @MaxAttempts INT = 5,
    @DateToProcess DATETIME2(3) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50136, N'@ID is required.', 1;
    SET @MaxAttempts = COALESCE(@MaxAttempts, 5);
    IF @MaxAttempts NOT BETWEEN 1 AND 20
    BEGIN
        SET @Msg = CONCAT(N'@MaxAttempts must be 1-20; got ', @MaxAttempts, N'.');
        THROW 50119, @Msg, 1;
    END;
    SET @DateToProcess = COALESCE(@DateToProcess, SYSUTCDATETIME());
    DECLARE @Status NVARCHAR(16), @To NVARCHAR(MAX), @CC NVARCHAR(MAX), @BCC NVARCHAR(MAX), @Left INT,
        @Suppressed NVARCHAR(MAX);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- Addresses suppressed since the mail was queued (the sweep passes finished mail by): left out as at
        -- enqueue.  Read before the row lock, in the suppression lock order; a finished mail's lists never change.
        SELECT @To = f.ToAddress, @CC = f.CC, @BCC = f.BCC, @Left = f.EntriesLeft, @Suppressed = f.Suppressed
        FROM mailq.MailQueue AS q
        CROSS APPLY mailq.FilterSuppressedRecipients(q.AccountName, q.AppName, q.ToAddress, q.CC, q.BCC) AS f
        WHERE q.ID = @ID;
        -- UPDLOCK: check and change under one lock.
        SELECT @Status = q.Status
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @ID;
        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status NOT IN (N'Failed', N'Cancelled', N'Expired', N'Stopped')
        BEGIN
            SET @Msg = CONCAT(
                N'Mail ', @ID, N' is ', @Status, N'; only Failed, Cancelled, Expired or Stopped mail can be requeued.'
            );
            THROW 50205, @Msg, 1;
        END;
        IF @Left = 0
        BEGIN
            SET @Msg = LEFT(CONCAT(N'Mail ', @ID, N': every recipient is suppressed (mailq.RemoveSuppression first): ',
                @Suppressed), 2048);
            THROW 50600, @Msg, 1;
        END;
        UPDATE q
        SET
            q.Status = N'UnSent',
            q.DateToProcess = @DateToProcess,
            q.VisibleAtUtc = @DateToProcess,
            q.AttemptsRemaining = @MaxAttempts,
            q.ExpiresAtUtc = IIF(q.ExpiresAtUtc > @DateToProcess, q.ExpiresAtUtc, NULL),
            q.DateProcessed = NULL,
            q.ToAddress = IIF(@Suppressed IS NULL, q.ToAddress, ISNULL(@To, N'')),
            q.CC = IIF(@Suppressed IS NULL, q.CC, @CC),
            q.BCC = IIF(@Suppressed IS NULL, q.BCC, @BCC)
        -- The Requeued event in the same statement (docs/events.md).
        OUTPUT
            inserted.ID, inserted.AppName, N'Requeued', inserted.Status, inserted.AttemptCount,
            NULL, NULL, SYSUTCDATETIME()
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT q.ID, q.AppName, N'RecipientSuppressed', q.Status, q.AttemptCount, NULL,
            LEFT(CONCAT(N'not sent to (suppressed): ', @Suppressed), 4000), SYSUTCDATETIME()
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID AND @Suppressed IS NOT NULL;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        @ID AS ID,
        N'UnSent' AS Status,
        @DateToProcess AS NextAttemptUtc;
END;
