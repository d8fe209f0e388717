/*
mailq.StopMail: ends a mail that is not yet final with Status 'Stopped' and
a reason: no more attempts (TinyMail's stop()).  Works on an UnSent mail
and on a Sending one: the lease is taken away (ThreadLock NULL) and the open
attempt is closed with Outcome 'Stop', so the worker's later MarkSent /
MarkFailed / ReleaseMail / ExtendLease is refused by the fence
(mailq.LockLeasedMail: 50203, the mail is not Sending) and can never make
the mail Sent or UnSent again.  An SMTP transaction already under way may
still deliver that one copy; the event stream says Stopped, and
PossibleDuplicate is set (as FinalizeMail does for a lease it ends), so
after a RequeueMail, ClaimMail hands the mail out with PossibleDuplicate = 1.  A Stopped mail
can be put back with mailq.RequeueMail (after the cause is fixed).
Stopping a final mail (Sent, Failed, Cancelled, Expired, Stopped) is error
50260 and changes nothing: the caller learns that the mail ended otherwise
(its events say how).
Parameters:  @MailID BIGINT, required; @Reason NVARCHAR(4000), required
             (stored in LastError and in the Stopped event's Detail).
Result set:  one row: ID, Status ('Stopped'), NextAttemptUtc (NULL).
Errors:      50174 @MailID missing; 50175 @Reason missing or blank;
             50201 unknown mail; 50260 the mail is already final.
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms (XACT_STATE() = -1)
             or rolls back the caller's transaction, so the caller must roll back.
Isolation:   sets READ COMMITTED itself (UPDLOCK check-then-update; a level set
             in a procedure reverts when it returns).
Lock order:  mailq.MailQueue (clustered row, U -> X), then mailq.MailEvent
             (insert), then mailq.MailAttempt: MailQueue first, as every
             mail-queue procedure.
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
    -- Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        -- UPDLOCK: check and change under one lock, so neither a claim nor an
        -- acknowledgement slips in between (they take the same row's U/X lock).
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

        -- The change and its event in one statement (mailq.MailEvent has no
        -- trigger, foreign key or CHECK constraint: OUTPUT INTO allows it).
        -- A leased mail may already be in an SMTP transaction: flag it, as
        -- FinalizeMail does (a requeued copy is then claimed as such).
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
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        @MailID AS ID,
        N'Stopped' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc;
END;
