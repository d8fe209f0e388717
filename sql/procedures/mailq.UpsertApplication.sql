/*
mailq.UpsertApplication: registers an application name that mails may carry
(@AppName of EnqueueMail) and isolated workers may claim by, or changes its
description.
Parameters:  @AppName NVARCHAR(128), required; @Description NVARCHAR(400), optional.
Result set:  none.
Errors:      50145 @AppName missing; 50103 a value over its size.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.UpsertApplication @AppName = N'billing', @Description = N'Invoices';
*/
CREATE OR ALTER PROCEDURE mailq.UpsertApplication
    @AppName NVARCHAR(4000),
    @Description NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    IF NULLIF(LTRIM(RTRIM(@AppName)), N'') IS NULL
        THROW 50145, N'@AppName is required.', 1;
    IF LEN(@AppName) > 128 OR LEN(@Description) > 400
        THROW 50103, N'@AppName (128) or @Description (400) is over its size.', 1;

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION UpsertApplication;

        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race between two callers.
        IF EXISTS (SELECT 1 FROM mailq.Application AS p WITH (UPDLOCK, HOLDLOCK) WHERE p.AppName = @AppName)
            UPDATE p
            SET p.Description = @Description
            FROM mailq.Application AS p
            WHERE p.AppName = @AppName;
        ELSE
            INSERT INTO mailq.Application (AppName, Description)
            VALUES (@AppName, @Description);

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION UpsertApplication;
        THROW;
    END CATCH;
END;
