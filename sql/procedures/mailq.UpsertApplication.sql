/*
mailq.UpsertApplication: registers an application name that mails may carry
(@AppName of EnqueueMail) and isolated workers may claim by, or changes its
description.  A new application is bound to nothing: before it can enqueue,
an administrator binds it to its sending accounts and From addresses or
domains (mailq.BindApplication; EnqueueMail refuses with 50160/50161).
Parameters:  @AppName NVARCHAR(128), required; @Description NVARCHAR(400), optional;
             @DryRun BIT, optional (revision 0015): 1 = the application's mails
             go the whole path (claim, lease, acknowledgement) and are
             recorded as DryRun, reaching no server; 0 = they are sent; NULL
             (default) = unchanged (0 for a new application).  Takes effect
             at the next claim of each mail (the claim stamps it; a mail
             already leased keeps what its claim said).
Result set:  none.
Errors:      50145 @AppName missing; 50103 a value over its size.
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms (XACT_STATE() = -1)
             or rolls back the caller's transaction, so the caller must roll back.
Isolation:   sets READ COMMITTED itself (UPDLOCK, HOLDLOCK insert-if-absent on a
             small admin table).
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

    -- Own the transaction if none is open; otherwise work inside the caller's.
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
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
