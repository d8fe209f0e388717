/*
mailq.RequeueMail: puts a Failed, Cancelled, Expired or Stopped mail back in the
queue (UnSent) with fresh attempts; PossibleDuplicate and the attempt history are
kept.  An expiry not after the new due time is cleared.
Parameters:  @ID BIGINT, required; @MaxAttempts INT 1-20 = 5; @DateToProcess UTC = now
Result set:  one row: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50136 @ID missing; 50119 @MaxAttempts out of range; 50201 unknown
             mail; 50205 the mail is not Failed, Cancelled, Expired or Stopped.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK check-then-update).
Lock order:  mailq.MailQueue (the clustered row), then mailq.MailEvent (insert).
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

    DECLARE @Status NVARCHAR(16);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
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

        UPDATE q
        SET
            q.Status = N'UnSent',
            q.DateToProcess = @DateToProcess,
            q.VisibleAtUtc = @DateToProcess,
            q.AttemptsRemaining = @MaxAttempts,
            q.ExpiresAtUtc = IIF(q.ExpiresAtUtc > @DateToProcess, q.ExpiresAtUtc, NULL),
            q.DateProcessed = NULL
        -- The Requeued event in the same statement (docs/events.md).
        OUTPUT
            inserted.ID, inserted.AppName, N'Requeued', inserted.Status, inserted.AttemptCount,
            NULL, NULL, SYSUTCDATETIME()
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;
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
