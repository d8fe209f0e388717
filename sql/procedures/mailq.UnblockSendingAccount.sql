/*
mailq.UnblockSendingAccount: clears an account's BlockedUntilUtc (set by MarkFailed
'Wait') and makes the mails a Wait deferred visible now (never before their own
DateToProcess); mail scheduled later or in Retry backoff keeps its time.
Parameters:  @AccountName NVARCHAR(128), required.
Result set:  one row: AccountName, MadeVisibleCount INT.
Errors:      50142 @AccountName missing; 50114 unknown account.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here; the attempt read is READCOMMITTEDLOCK.
Lock order:  mailq.MailQueue, reading mailq.MailAttempt, then mailq.SendingAccount
             (MarkFailed's order: an unblock and a Wait never deadlock).
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
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        CAST(@AccountName AS NVARCHAR(128)) AS AccountName,
        @Visible AS MadeVisibleCount;
END;
