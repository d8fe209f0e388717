/*
mailq.UnblockSendingAccount: clears an account's BlockedUntilUtc (set by
MarkFailed @Disposition = 'Wait'), e.g. once the provider lifted a lock early.
Parameters:  @AccountName NVARCHAR(128), required.
Result set:  none.
Errors:      50142 @AccountName missing; 50114 unknown account.
Transaction: a single statement; joins the caller's if any.
Example:     EXEC mailq.UnblockSendingAccount @AccountName = N'qq';
*/
CREATE OR ALTER PROCEDURE mailq.UnblockSendingAccount
    @AccountName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;

    UPDATE a
    SET
        a.BlockedUntilUtc = NULL,
        a.BlockReason = NULL
    FROM mailq.SendingAccount AS a
    WHERE a.AccountName = @AccountName;

    IF @@ROWCOUNT = 0
    BEGIN
        SET @Msg = CONCAT(N'@AccountName ''', LEFT(@AccountName, 128), N''' is not a sending account.');
        THROW 50114, @Msg, 1;
    END;
END;
