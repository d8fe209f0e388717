/*
mailq.DeleteDbMailProfile: deletes a profile with its account list and grants (msdb's
sysmail_delete_profile_sp); mail already queued through it keeps its account.
Parameters:  @ProfileName NVARCHAR(128), required.  Errors: 50198 @ProfileName missing; 50250 no such profile.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.DbMailProfile, mailq.DbMailProfileAccount, mailq.DbMailPrincipalProfile.
Example:     EXEC mailq.DeleteDbMailProfile @ProfileName = N'Ops';
*/
CREATE OR ALTER PROCEDURE mailq.DeleteDbMailProfile
    @ProfileName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL
        THROW 50198, N'@ProfileName is required.', 1;
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
        WHERE pa.ProfileID = @ProfileID;
        DELETE pp
        FROM mailq.DbMailPrincipalProfile AS pp
        WHERE pp.ProfileID = @ProfileID;
        DELETE p
        FROM mailq.DbMailProfile AS p
        WHERE p.ProfileID = @ProfileID;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
