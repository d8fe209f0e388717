/*
mailq.UnblockSendingAccount: clears an account's BlockedUntilUtc (set by
MarkFailed @Disposition = 'Wait'), e.g. once the provider lifted a lock early,
and makes the mails that a Wait deferred visible now: UnSent mails of the
account whose last attempt ended with Outcome 'Wait' and whose VisibleAtUtc
is still in the future get VisibleAtUtc = now (never earlier than their own
DateToProcess).  Mails scheduled for later by their sender, or deferred by a
Retry backoff, keep their time.
Parameters:  @AccountName NVARCHAR(128), required.
Result set:  one row: AccountName, MadeVisibleCount INT.
Errors:      50142 @AccountName missing; 50114 unknown account.
Transaction: its own if none is open, else the caller's (no savepoint); an error
             is re-raised and dooms the caller's transaction (XACT_ABORT ON).
Isolation:   sets READ COMMITTED itself; the attempt read says READCOMMITTEDLOCK
             (under READ_COMMITTED_SNAPSHOT it must see a MarkFailed in flight).
Lock order:  mailq.MailQueue (the deferred mails), reading mailq.MailAttempt,
             then mailq.SendingAccount: the order MarkFailed keeps, so an
             unblock and a Wait never deadlock.
Example:     EXEC mailq.UnblockSendingAccount @AccountName = N'qq';
*/
CREATE OR ALTER PROCEDURE mailq.UnblockSendingAccount
    @AccountName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;
    IF NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @AccountName)
    BEGIN
        SET @Msg = CONCAT(N'@AccountName ''', LEFT(@AccountName, 128), N''' is not a sending account.');
        THROW 50114, @Msg, 1;
    END;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Visible INT = 0;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        -- ROWLOCK: row grain on the account's deferred mails only.
        UPDATE q
        SET q.VisibleAtUtc = IIF(q.DateToProcess > @Now, q.DateToProcess, @Now)
        FROM mailq.MailQueue AS q WITH (ROWLOCK)
        WHERE
            q.AccountName = @AccountName
            AND q.Status = N'UnSent'
            AND q.VisibleAtUtc > @Now
            AND EXISTS (
                SELECT 1
                FROM mailq.MailAttempt AS t WITH (READCOMMITTEDLOCK)
                WHERE t.MailID = q.ID AND t.AttemptNo = q.AttemptCount AND t.Outcome = N'Wait'
            );
        SET @Visible = @@ROWCOUNT;

        UPDATE a
        SET
            a.BlockedUntilUtc = NULL,
            a.BlockReason = NULL
        FROM mailq.SendingAccount AS a
        WHERE a.AccountName = @AccountName;

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        CAST(@AccountName AS NVARCHAR(128)) AS AccountName,
        @Visible AS MadeVisibleCount;
END;
