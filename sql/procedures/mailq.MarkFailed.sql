/*
mailq.MarkFailed: records a failed attempt; fenced by the lock token, all or
nothing.  @Disposition (docs/smtp-classification.md):
  Retry  the attempt is spent; UnSent again after @RetryAfterSeconds, or 30 s *
         2^(attempt-1) (at most 1 hour) times 0.8-1.2; Failed when none is left.
  Wait   throttled: the attempt is refunded, UnSent again after @RetryAfterSeconds
         (default 60), the account blocked until then.
  Stop   permanent: Failed at once.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, @Disposition NVARCHAR(8), @Error
             NVARCHAR(4000), required; @RetryAfterSeconds INT 0-604800, @SmtpCode INT 200-599;
             @PossibleDuplicate BIT, default 0: 1 when the server may have the mail (no reply
             after the final dot): the mails keep PossibleDuplicate = 1 (RequeueMail clears it)
Result set:  one row per mail changed: ID, Status (UnSent or Failed), NextAttemptUtc; a
             repeated call (same @LockToken, attempt already ended) changes and returns none.
Errors:      50131, 50136, 50137, 50201-50203 (mailq.LockLeasedMail); 50133
             @Disposition; 50134 @RetryAfterSeconds; 50139 @Error; 50147 @SmtpCode.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (the fence reads with UPDLOCK).
Lock order:  mailq.MailQueue (LockLeasedMail), MailAttempt, MailEvent, SendingAccount (Wait).
Example:     EXEC mailq.MarkFailed @ID = 101, @LockToken = @T, @Disposition = N'Retry',
                 @Error = N'451 4.3.0 try again later', @SmtpCode = 451;
*/
CREATE OR ALTER PROCEDURE mailq.MarkFailed
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @Disposition NVARCHAR(20),
    @Error NVARCHAR(4000),
    @RetryAfterSeconds INT = NULL,
    @SmtpCode INT = NULL,
    @PossibleDuplicate BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @Disposition IS NULL OR @Disposition NOT IN (N'Retry', N'Wait', N'Stop')
    BEGIN
        SET @Msg = CONCAT(N'@Disposition must be Retry, Wait or Stop; got ''', @Disposition, N'''.');
        THROW 50133, @Msg, 1;
    END;
    IF NULLIF(LTRIM(RTRIM(@Error)), N'') IS NULL
        THROW 50139, N'@Error is required: say what failed (the SMTP reply or the exception).', 1;
    IF @RetryAfterSeconds NOT BETWEEN 0 AND 604800
    BEGIN
        SET @Msg = CONCAT(N'@RetryAfterSeconds must be 0-604800 (7 days); got ', @RetryAfterSeconds, N'.');
        THROW 50134, @Msg, 1;
    END;
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @WaitUntil DATETIME2(3) = DATEADD(SECOND, COALESCE(@RetryAfterSeconds, 60), @Now);
    DECLARE @Acked TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AttemptNo INT NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NULL,
        Status NVARCHAR(16) NOT NULL,
        NextAttemptUtc DATETIME2(3) NULL
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.LockLeasedMail
            @ID = @ID, @IDList = @IDList, @LockToken = @LockToken, @AcceptFailedByToken = 1;
        WITH Outcome AS (
            SELECT
                q.ID,
                q.AccountName,
                q.AppName,
                q.Status,
                q.ThreadLock,
                q.VisibleAtUtc,
                q.AttemptsRemaining,
                q.AttemptCount,
                q.DateProcessed,
                q.LastError,
                q.PossibleDuplicate,
                CASE
                    WHEN @Disposition = N'Wait' THEN N'UnSent'
                    WHEN @Disposition = N'Retry' AND q.AttemptsRemaining > 0 THEN N'UnSent'
                    ELSE N'Failed'
                END AS NewStatus,
                CASE
                    WHEN @Disposition = N'Wait' THEN @WaitUntil
                    WHEN @RetryAfterSeconds IS NOT NULL THEN DATEADD(SECOND, @RetryAfterSeconds, @Now)
                    -- Exponential backoff with jitter; NEWID() gives each row its own.
                    ELSE DATEADD(
                        MILLISECOND,
                        CAST(
                            IIF(
                                q.AttemptCount >= 8, 3600,
                                30 * POWER(2, IIF(q.AttemptCount < 1, 0, q.AttemptCount - 1))
                            )
                            -- modulo before ABS: ABS(-2147483648) would overflow
                            * (800 + ABS(CHECKSUM(NEWID()) % 401)) AS INT
                        ),
                        @Now
                    )
                END AS RetryAtUtc
            FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
            INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
            WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken
        )

        UPDATE o
        SET
            o.Status = o.NewStatus,
            o.ThreadLock = NULL,
            o.VisibleAtUtc = IIF(o.NewStatus = N'UnSent', o.RetryAtUtc, o.VisibleAtUtc),
            -- Wait is not the mail's fault: its attempt is refunded.
            o.AttemptsRemaining = o.AttemptsRemaining + IIF(@Disposition = N'Wait', 1, 0),
            o.DateProcessed = @Now,
            o.LastError = @Error,
            o.PossibleDuplicate = IIF(@PossibleDuplicate = 1, CAST(1 AS BIT), o.PossibleDuplicate)
        OUTPUT
            inserted.ID,
            inserted.AttemptCount,
            inserted.AccountName,
            inserted.AppName,
            inserted.Status,
            IIF(inserted.Status = N'UnSent', inserted.VisibleAtUtc, NULL)
        INTO @Acked (ID, AttemptNo, AccountName, AppName, Status, NextAttemptUtc)
        FROM Outcome AS o;
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = @Disposition,
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @Error
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;
        -- One event per mail (docs/events.md): AccountWaiting, RetryScheduled or Failed.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT
            a.ID,
            a.AppName,
            CASE
                WHEN @Disposition = N'Wait' THEN N'AccountWaiting'
                WHEN a.Status = N'UnSent' THEN N'RetryScheduled'
                ELSE N'Failed'
            END,
            a.Status,
            a.AttemptNo,
            @SmtpCode,
            @Error,
            @Now
        FROM @Acked AS a;
        IF @Disposition = N'Wait'
            UPDATE s
            SET
                s.BlockedUntilUtc = IIF(s.BlockedUntilUtc > @WaitUntil, s.BlockedUntilUtc, @WaitUntil),
                s.BlockReason = @Error
            FROM mailq.SendingAccount AS s
            WHERE s.AccountName IN (SELECT a.AccountName FROM @Acked AS a);
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        a.ID,
        a.Status,
        a.NextAttemptUtc
    FROM @Acked AS a
    ORDER BY a.ID;
END;
