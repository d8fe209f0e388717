/*
mailq.StopMail: ends a mail that is not final with Status 'Stopped' and a reason.
A Sending mail loses its lease and its open attempt is closed (Outcome 'Stop'), so
the worker's acknowledgement is refused (50203); a copy already in an SMTP
transaction may still arrive: PossibleDuplicate is set.  RequeueMail undoes it.
Parameters:  @MailID BIGINT, @Reason NVARCHAR(4000) (LastError, event Detail): required
Result set:  one row: ID, Status ('Stopped'), NextAttemptUtc (NULL).
Errors:      50174 @MailID missing; 50175 @Reason blank; 50201 unknown; 50260 final.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK check-then-update).
Lock order:  mailq.MailQueue, then mailq.MailEvent, then mailq.MailAttempt.
Example:     EXEC mailq.StopMail @MailID = 101, @Reason = N'Customer closed the account.';
*/
CREATE OR ALTER PROCEDURE mailq.StopMail
    @MailID BIGINT,
    @Reason NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @MailID IS NULL
        THROW 50174, N'@MailID is required.', 1;
    IF NULLIF(LTRIM(RTRIM(@Reason)), N'') IS NULL
        THROW 50175, N'@Reason is required: say why the mail is stopped.', 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Status NVARCHAR(16);
    DECLARE @OldLockToken UNIQUEIDENTIFIER;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK: no claim or acknowledgement slips in between check and change.
        SELECT
            @Status = q.Status,
            @OldLockToken = q.ThreadLock
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @MailID;
        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @MailID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status NOT IN (N'UnSent', N'Sending')
        BEGIN
            SET @Msg = CONCAT(
                N'Mail ', @MailID, N' is already ', @Status, N'; only an UnSent or Sending mail can be stopped.'
            );
            THROW 50260, @Msg, 1;
        END;
        -- Change and event in one statement (MailEvent has no trigger, FK or CHECK).
        -- A leased mail may be mid-SMTP: flag it, as FinalizeMail does.
        UPDATE q
        SET
            q.Status = N'Stopped',
            q.ThreadLock = NULL,
            q.PossibleDuplicate = IIF(q.Status = N'Sending', CAST(1 AS BIT), q.PossibleDuplicate),
            q.DateProcessed = @Now,
            q.LastError = @Reason
        OUTPUT
            inserted.ID, inserted.AppName, N'Stopped', inserted.Status, inserted.AttemptCount,
            NULL, @Reason, @Now
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        WHERE q.ID = @MailID;
        -- A leased mail: close the worker's open attempt (seek by mail ID).
        IF @Status = N'Sending'
            UPDATE t
            SET
                t.EndedAtUtc = @Now,
                t.Outcome = N'Stop',
                t.ErrorText = LEFT(CONCAT(N'Stopped by mailq.StopMail: ', @Reason), 4000)
            FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)
            WHERE t.MailID = @MailID AND t.LockToken = @OldLockToken AND t.EndedAtUtc IS NULL;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        @MailID AS ID,
        N'Stopped' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc;
END;
