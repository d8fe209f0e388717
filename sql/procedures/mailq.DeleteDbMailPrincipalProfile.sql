/*
mailq.DeleteDbMailPrincipalProfile: withdraws a principal's right to use a profile, and the
default with it (msdb's sysmail_delete_principalprofile_sp).
Parameters:  @ProfileName NVARCHAR(128), @PrincipalName NVARCHAR(128), required.
Errors:      50198 a parameter missing; 50250 no such profile; 50254 no grant to withdraw.
Transaction: its own if none is open, else the caller's; an error dooms it (XACT_ABORT ON).
Isolation:   sets READ COMMITTED.  Lock order: mailq.DbMailProfile, mailq.DbMailPrincipalProfile.
Example:     EXEC mailq.DeleteDbMailPrincipalProfile @ProfileName = N'Ops', @PrincipalName = N'public';
*/
CREATE OR ALTER PROCEDURE mailq.DeleteDbMailPrincipalProfile
    @ProfileName NVARCHAR(4000),
    @PrincipalName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL OR NULLIF(LTRIM(RTRIM(@PrincipalName)), N'') IS NULL
        THROW 50198, N'@ProfileName and @PrincipalName are required.', 1;
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
        DELETE pp
        FROM mailq.DbMailPrincipalProfile AS pp
        WHERE pp.ProfileID = @ProfileID AND pp.PrincipalName = @PrincipalName;
        IF @@ROWCOUNT = 0
        BEGIN
            SET @Msg = CONCAT(
                N'@PrincipalName ''', LEFT(@PrincipalName, 128), N''' has no grant on profile ''', @ProfileName, N'''.'
            );
            THROW 50254, @Msg, 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
