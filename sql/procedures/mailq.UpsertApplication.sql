/*
mailq.UpsertApplication: registers an application name that mails may carry and
isolated workers may claim by, or changes it.  A new application is bound to
nothing: mailq.BindApplication first, else EnqueueMail refuses (50160/50161).
Parameters:  @AppName NVARCHAR(128), required; @Description NVARCHAR(400)
             @DryRun BIT: 1 = its mails go the whole path but are recorded as
             DryRun, reaching no server; 0 = sent; NULL = unchanged (0 when new);
             takes effect at each mail's next claim
Result set:  none.
Errors:      50145 @AppName missing; 50103 a value over its size.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK, HOLDLOCK insert-if-absent).
Lock order:  mailq.Application only.
Example:     EXEC mailq.UpsertApplication @AppName = N'billing', @Description = N'Invoices';
*/
CREATE OR ALTER PROCEDURE mailq.UpsertApplication
    @AppName NVARCHAR(4000),
    @Description NVARCHAR(4000) = NULL,
    @DryRun BIT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF NULLIF(LTRIM(RTRIM(@AppName)), N'') IS NULL
        THROW 50145, N'@AppName is required.', 1;
    IF LEN(@AppName) > 128 OR LEN(@Description) > 400
        THROW 50103, N'@AppName (128) or @Description (400) is over its size.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race between two callers.
        IF EXISTS (SELECT 1 FROM mailq.Application AS p WITH (UPDLOCK, HOLDLOCK) WHERE p.AppName = @AppName)
            UPDATE p
            SET
                p.Description = @Description,
                p.DryRun = COALESCE(@DryRun, p.DryRun)
            FROM mailq.Application AS p
            WHERE p.AppName = @AppName;
        ELSE
            INSERT INTO mailq.Application (AppName, Description, DryRun)
            VALUES (@AppName, @Description, COALESCE(@DryRun, CAST(0 AS BIT)));
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
