/*
mailq.ReleaseMail: gives back mails a worker holds but has not sent (e.g. on
shutdown): UnSent and due now, the attempt refunded, the attempt row closed
as Released.  Fenced by the lock token, all or nothing.  The rate budget the
claim took is not refunded (limits stay conservative).
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required.
Result set:  one row per mail: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail).
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.ReleaseMail @IDList = N'[103,104]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.ReleaseMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Released TABLE (ID BIGINT NOT NULL PRIMARY KEY, AttemptNo INT NOT NULL);

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION ReleaseMail;

        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;

        UPDATE q
        SET
            q.Status = N'UnSent',
            q.ThreadLock = NULL,
            q.VisibleAtUtc = @Now,
            q.AttemptsRemaining = q.AttemptsRemaining + 1
        OUTPUT inserted.ID, inserted.AttemptCount INTO @Released (ID, AttemptNo)
        FROM mailq.MailQueue AS q
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Released'
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Released AS r ON t.MailID = r.ID AND t.AttemptNo = r.AttemptNo;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION ReleaseMail;
        THROW;
    END CATCH;

    SELECT
        r.ID,
        N'UnSent' AS Status,
        @Now AS NextAttemptUtc
    FROM @Released AS r
    ORDER BY r.ID;
END;
