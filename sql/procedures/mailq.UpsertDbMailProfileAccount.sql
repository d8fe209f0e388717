/*
mailq.UpsertDbMailProfileAccount: adds a sending account to a profile or changes
its failover place (msdb's sysmail_add/update_profileaccount_sp); SendDbMail takes
the lowest @SequenceNumber not blocked.
Parameters:  @ProfileName NVARCHAR(128); @AccountName NVARCHAR(128) (a
             mailq.SendingAccount); @SequenceNumber INT >= 0; all required
Errors:      50198 a parameter missing or @SequenceNumber negative;
             50250 no such profile; 50253 no such sending account.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK reads the latest committed row).
Lock order:  mailq.DbMailProfile, mailq.DbMailAccount, mailq.DbMailProfileAccount.
Example:     EXEC mailq.UpsertDbMailProfileAccount @ProfileName = N'Ops',
                 @AccountName = N'smtp-primary', @SequenceNumber = 1;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertDbMailProfileAccount
    @ProfileName NVARCHAR(4000),
    @AccountName NVARCHAR(4000),
    @SequenceNumber INT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL OR NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50198, N'@ProfileName and @AccountName are required.', 1;
    IF @SequenceNumber IS NULL OR @SequenceNumber < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@SequenceNumber must be 0 or more; got ', COALESCE(CONVERT(NVARCHAR(20), @SequenceNumber), N'NULL'), N'.'
        );
        THROW 50198, @Msg, 1;
    END;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        DECLARE @ProfileID INT, @AccountID INT;
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@ProfileName ''', @ProfileName, N''' is not a profile (mailq.UpsertDbMailProfile).');
            THROW 50250, @Msg, 1;
        END;
        IF NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @AccountName)
        BEGIN
            SET @Msg = CONCAT(
                N'@AccountName ''', @AccountName, N''' is not a sending account (mailq.UpsertSendingAccount).'
            );
            THROW 50253, @Msg, 1;
        END;
        -- UPDLOCK, HOLDLOCK: insert-if-absent on small, rarely written tables.
        SELECT @AccountID = da.AccountID
        FROM mailq.DbMailAccount AS da WITH (UPDLOCK, HOLDLOCK)
        WHERE da.AccountName = @AccountName;
        IF @AccountID IS NULL
        BEGIN
            INSERT INTO mailq.DbMailAccount (AccountName) VALUES (@AccountName);
            SET @AccountID = SCOPE_IDENTITY();
        END;
        IF EXISTS (
            SELECT 1
            FROM mailq.DbMailProfileAccount AS pa WITH (UPDLOCK, HOLDLOCK)
            WHERE pa.ProfileID = @ProfileID AND pa.AccountID = @AccountID
        )
            UPDATE pa
            SET pa.SequenceNumber = @SequenceNumber
            FROM mailq.DbMailProfileAccount AS pa
            WHERE pa.ProfileID = @ProfileID AND pa.AccountID = @AccountID;
        ELSE
            INSERT INTO mailq.DbMailProfileAccount (ProfileID, AccountID, SequenceNumber)
            VALUES (@ProfileID, @AccountID, @SequenceNumber);
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
