/*
mailq.UpsertDbMailProfile: creates a Database Mail compatible profile (for
mailq.SendDbMail) or changes its description (msdb's sysmail_add/update_profile_sp).
Parameters:  @ProfileName NVARCHAR(128), required; @Description NVARCHAR(256).
Outputs:     @ProfileID INT: the profile_id the sysmail_* views show.
Errors:      50198 @ProfileName missing or a value over its size.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK reads the latest committed row).
Lock order:  DbMailProfile, DbMailAccount, DbMailProfileAccount, DbMailPrincipalProfile.
Example:     EXEC mailq.UpsertDbMailProfile @ProfileName = N'Ops', @Description = N'Alerts';
*/
CREATE OR ALTER PROCEDURE mailq.UpsertDbMailProfile
    @ProfileName NVARCHAR(4000),
    @Description NVARCHAR(4000) = NULL,
    @ProfileID INT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL
        THROW 50198, N'@ProfileName is required.', 1;
    IF LEN(@ProfileName) > 128 OR LEN(@Description) > 256
        THROW 50198, N'@ProfileName (128) or @Description (256) is over its size.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        SET @ProfileID = NULL;
        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race (a rarely written table).
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK, HOLDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NOT NULL
            UPDATE p
            SET p.Description = @Description
            FROM mailq.DbMailProfile AS p
            WHERE p.ProfileID = @ProfileID;
        ELSE
        BEGIN
            INSERT INTO mailq.DbMailProfile (ProfileName, Description)
            VALUES (@ProfileName, @Description);
            SET @ProfileID = SCOPE_IDENTITY();
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
