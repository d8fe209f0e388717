/*
mailq.ReleaseMail: gives back leased mails not sent (e.g. on shutdown): UnSent and
due now, the attempt refunded and closed as Released; fenced by the lock token,
all or nothing.  The rate budget taken is not refunded.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required.
Result set:  one row per mail: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail).
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (the fence reads with UPDLOCK).
Lock order:  mailq.MailQueue (via LockLeasedMail), mailq.MailAttempt, mailq.MailEvent.
Example:     EXEC mailq.ReleaseMail @IDList = N'[103,104]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.ReleaseMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Released TABLE (ID BIGINT NOT NULL PRIMARY KEY, AttemptNo INT NOT NULL, AppName NVARCHAR(128) NULL);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;
        UPDATE q
        SET
            q.Status = N'UnSent',
            q.ThreadLock = NULL,
            q.VisibleAtUtc = @Now,
            q.AttemptsRemaining = q.AttemptsRemaining + 1
        OUTPUT inserted.ID, inserted.AttemptCount, inserted.AppName INTO @Released (ID, AttemptNo, AppName)
        FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Released'
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Released AS r ON t.MailID = r.ID AND t.AttemptNo = r.AttemptNo;
        -- One Released event per mail, in this transaction (docs/events.md).
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT r.ID, r.AppName, N'Released', N'UnSent', r.AttemptNo, NULL, NULL, @Now
        FROM @Released AS r;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        r.ID,
        N'UnSent' AS Status,
        @Now AS NextAttemptUtc
    FROM @Released AS r
    ORDER BY r.ID;
END;
