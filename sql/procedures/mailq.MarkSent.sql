/*
mailq.MarkSent: records mails as sent; fenced by the lock token and all or nothing
(one call for every mail of one SMTP connection).  Repeatable: a mail this token
already marked Sent is accepted again, unchanged.  A mail claimed with DryRun = 1
is recorded as DryRun whatever @DryRun says (status Sent, event 'DryRun').
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array of 1-1000): exactly one;
             @LockToken UNIQUEIDENTIFIER, required; @SmtpCode INT 200-599,
             @SmtpText NVARCHAR(4000); @DryRun BIT = 0 (the worker sent nothing)
Result set:  one row per mail: ID, Status ('Sent'), NextAttemptUtc (NULL).
Errors:      50131, 50136, 50137, 50201-50203 (mailq.LockLeasedMail); 50147 @SmtpCode.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (the fence reads with UPDLOCK).
Lock order:  mailq.MailQueue (via LockLeasedMail), mailq.MailAttempt, mailq.MailEvent.
Example:     EXEC mailq.MarkSent @IDList = N'[101,102]', @LockToken = @T, @SmtpCode = 250;
*/
CREATE OR ALTER PROCEDURE mailq.MarkSent
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @SmtpCode INT = NULL,
    @SmtpText NVARCHAR(4000) = NULL,
    @DryRun BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @DryRun = COALESCE(@DryRun, 0);
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Acked TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AttemptNo INT NOT NULL,
        AppName NVARCHAR(128) NULL,
        DryRun BIT NOT NULL,
        Enforced BIT NOT NULL  -- claimed as dry-run, acknowledged as a real send
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.LockLeasedMail
            @ID = @ID, @IDList = @IDList, @LockToken = @LockToken, @AcceptSentByToken = 1;
        UPDATE q
        SET
            q.Status = N'Sent',
            q.ThreadLock = NULL,
            q.SentAtUtc = @Now,
            q.DateProcessed = @Now,
            -- The claim's stamp wins: a dry-run application's mail stays DryRun.
            q.DryRun = IIF(@DryRun = 1 OR q.DryRun = 1, CAST(1 AS BIT), CAST(0 AS BIT)),
            q.LastError = NULL
        OUTPUT
            inserted.ID,
            inserted.AttemptCount,
            inserted.AppName,
            inserted.DryRun,
            IIF(deleted.DryRun = 1 AND @DryRun = 0, CAST(1 AS BIT), CAST(0 AS BIT))
        INTO @Acked (ID, AttemptNo, AppName, DryRun, Enforced)
        FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = IIF(a.DryRun = 1, N'DryRun', N'Sent'),
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @SmtpText
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;
        -- One event per mail changed (docs/events.md); a repeat changes no row, writes none.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT
            a.ID, a.AppName, IIF(a.DryRun = 1, N'DryRun', N'Sent'), N'Sent', a.AttemptNo, @SmtpCode,
            IIF(
                a.Enforced = 1,
                LEFT(CONCAT(
                    N'Recorded as DryRun: application ''', a.AppName,
                    N''' is in dry-run (claimed with DryRun = 1) but the worker reported a real send. ',
                    @SmtpText
                ), 4000),
                @SmtpText
            ),
            @Now
        FROM @Acked AS a;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        l.ID,
        N'Sent' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc
    FROM mailq.ParseIDList(@ID, @IDList) AS l
    ORDER BY l.ID;
END;
