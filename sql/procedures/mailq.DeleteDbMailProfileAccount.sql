/*
mailq.DeleteDbMailProfileAccount: removes a sending account from a profile (msdb's
sysmail_delete_profileaccount_sp); mail already queued keeps its account.
Parameters:  @ProfileName NVARCHAR(128), @AccountName NVARCHAR(128), required.
Errors:      50198 a parameter missing; 50250 no such profile; 50253 not in the profile.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.DbMailProfile, mailq.DbMailAccount, mailq.DbMailProfileAccount.
Example:     EXEC mailq.DeleteDbMailProfileAccount @ProfileName = N'Ops', @AccountName = N'smtp-old';
*/
CREATE OR ALTER PROCEDURE mailq.DeleteDbMailProfileAccount
    @ProfileName NVARCHAR(4000),
    @AccountName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL OR NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50198, N'@ProfileName and @AccountName are required.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        DECLARE @ProfileID INT;
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@ProfileName ''', @ProfileName, N''' is not a profile.');
            THROW 50250, @Msg, 1;
        END;
        DELETE pa
        FROM mailq.DbMailProfileAccount AS pa
        INNER JOIN mailq.DbMailAccount AS da ON pa.AccountID = da.AccountID
        WHERE pa.ProfileID = @ProfileID AND da.AccountName = @AccountName;
        IF @@ROWCOUNT = 0
        BEGIN
            SET @Msg = CONCAT(
                N'@AccountName ''', @AccountName, N''' is not an account of profile ''', @ProfileName, N'''.'
            );
            THROW 50253, @Msg, 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
