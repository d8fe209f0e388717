/*
mailq.RemoveSuppression: the address may be mailed again by the account (or
the one application): deletes the suppression and records who removed it
and why in mailq.SuppressionHistory.  Mail swept while it applied keeps its
lists (or stays Stopped: mailq.RequeueMail puts it back).  Removing a
suppression that does not exist changes nothing (Removed = 0).
Parameters:  @AccountName NVARCHAR(128), required; @Address NVARCHAR(320),
             required; @Source NVARCHAR(200), required: who removes it;
             @AppName NVARCHAR(128), default NULL: the account-wide row; a
             name: that application's row; @Detail NVARCHAR(1000): why.
Result set:  one row: Removed INT (0 or 1).
Errors:      50601 @AccountName missing; 50602 @Address missing or over 320
             characters; 50604 @Source missing or over 200 characters.
Transaction: opens its own if none is open, else works inside the caller's;
             an error dooms either (XACT_ABORT ON) and is re-raised.
Isolation:   sets READ COMMITTED itself (the row read WITH (UPDLOCK, HOLDLOCK), then deleted).
Lock order:  mailq.Suppression, then mailq.SuppressionHistory.
Example:     EXEC mailq.RemoveSuppression @AccountName = N'news', @Address = N'old@example.com',
                 @Source = N'dba:alice', @Detail = N'The customer fixed the mailbox.';
*/
CREATE OR ALTER PROCEDURE mailq.RemoveSuppression
    @AccountName NVARCHAR(128),
    @Address NVARCHAR(400),
    @Source NVARCHAR(200),
    @AppName NVARCHAR(128) = NULL,
    @Detail NVARCHAR(1000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF NULLIF(@AccountName, N'') IS NULL
        THROW 50601, N'@AccountName is required.', 1;
    SET @Address = LOWER(LTRIM(RTRIM(@Address)));
    IF NULLIF(@Address, N'') IS NULL OR LEN(@Address) > 320
        THROW 50602, N'@Address is required: one address of 1-320 characters.', 1;
    IF NULLIF(LTRIM(RTRIM(@Source)), N'') IS NULL
        THROW 50604, N'@Source is required (1-200 characters): who removes the suppression.', 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Removed INT = 0;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- History first, then the delete (not OUTPUT INTO: CK_SuppressionHistory_Action forbids it, Msg 333).
        INSERT INTO mailq.SuppressionHistory (
            AccountName, Address, AppName, Action, Reason, Source, Detail, MailID, OccurredAtUtc
        )
        SELECT s.AccountName, s.Address, s.AppName, N'Removed', s.Reason, @Source, LEFT(@Detail, 1000), s.MailID, @Now
        FROM mailq.Suppression AS s WITH (UPDLOCK, HOLDLOCK)
        WHERE s.AccountName = @AccountName AND s.Address = @Address AND s.AppName = ISNULL(@AppName, N'');
        DELETE s
        FROM mailq.Suppression AS s
        WHERE s.AccountName = @AccountName AND s.Address = @Address AND s.AppName = ISNULL(@AppName, N'');
        SET @Removed = @@ROWCOUNT;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT @Removed AS Removed;
END;
