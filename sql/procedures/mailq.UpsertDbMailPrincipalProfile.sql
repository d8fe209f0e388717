/*
mailq.UpsertDbMailPrincipalProfile: lets a principal use a profile, optionally as
its default (msdb's sysmail_add/update_principalprofile_sp); N'public' makes a
public profile.  A new default clears the principal's previous one.
Parameters:  @ProfileName NVARCHAR(128), required
             @PrincipalName NVARCHAR(128): a user or role of this database, or N'public'
             @IsDefault BIT = 0
Errors:      50198 a parameter missing; 50250 no such profile;
             50254 @PrincipalName is not a user or role of this database.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK reads the latest committed row).
Lock order:  mailq.DbMailProfile, mailq.DbMailPrincipalProfile.
Example:     EXEC mailq.UpsertDbMailPrincipalProfile @ProfileName = N'Ops',
                 @PrincipalName = N'public', @IsDefault = 1;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertDbMailPrincipalProfile
    @ProfileName NVARCHAR(4000),
    @PrincipalName NVARCHAR(4000),
    @IsDefault BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @IsDefault = COALESCE(@IsDefault, 0);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL OR NULLIF(LTRIM(RTRIM(@PrincipalName)), N'') IS NULL
        THROW 50198, N'@ProfileName and @PrincipalName are required.', 1;
    IF @PrincipalName <> N'public' AND DATABASE_PRINCIPAL_ID(@PrincipalName) IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@PrincipalName ''', LEFT(@PrincipalName, 128), N''' is not a user or role of this database.'
        );
        THROW 50254, @Msg, 1;
    END;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        DECLARE @ProfileID INT;
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@ProfileName ''', @ProfileName, N''' is not a profile (mailq.UpsertDbMailProfile).');
            THROW 50250, @Msg, 1;
        END;
        -- UPDLOCK, HOLDLOCK: two calls cannot both leave a default.
        IF @IsDefault = 1
            UPDATE pp
            SET pp.IsDefault = 0
            FROM mailq.DbMailPrincipalProfile AS pp WITH (UPDLOCK, HOLDLOCK)
            WHERE pp.PrincipalName = @PrincipalName AND pp.IsDefault = 1 AND pp.ProfileID <> @ProfileID;
        IF EXISTS (
            SELECT 1
            FROM mailq.DbMailPrincipalProfile AS pp WITH (UPDLOCK, HOLDLOCK)
            WHERE pp.PrincipalName = @PrincipalName AND pp.ProfileID = @ProfileID
        )
            UPDATE pp
            SET pp.IsDefault = @IsDefault
            FROM mailq.DbMailPrincipalProfile AS pp
            WHERE pp.PrincipalName = @PrincipalName AND pp.ProfileID = @ProfileID;
        ELSE
            INSERT INTO mailq.DbMailPrincipalProfile (PrincipalName, ProfileID, IsDefault)
            VALUES (@PrincipalName, @ProfileID, @IsDefault);
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
