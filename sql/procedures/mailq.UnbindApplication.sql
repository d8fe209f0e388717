/*
mailq.UnbindApplication: withdraws what mailq.BindApplication allowed; queued mail
is not touched, later enqueues are refused.  Unbinding what is not bound is a no-op.
Parameters:  @AppName NVARCHAR(128), required; at least one of:
             @AccountName NVARCHAR(128): the account to withdraw
             @FromAddress NVARCHAR(320): the address or '@domain' (case-insensitive)
             @PrincipalName sysname: the database user to unmap (if mapped to @AppName)
Result set:  none.
Errors:      50145 @AppName missing; 50164 none of the three.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here.
Lock order:  mailq.ApplicationAccount, mailq.ApplicationFrom, mailq.ApplicationPrincipal.
Example:     EXEC mailq.UnbindApplication @AppName = N'billing', @AccountName = N'qq';
*/
CREATE OR ALTER PROCEDURE mailq.UnbindApplication
    @AppName NVARCHAR(4000),
    @AccountName NVARCHAR(4000) = NULL,
    @FromAddress NVARCHAR(4000) = NULL,
    @PrincipalName NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF NULLIF(LTRIM(RTRIM(@AppName)), N'') IS NULL
        THROW 50145, N'@AppName is required.', 1;
    IF @AccountName IS NULL AND @FromAddress IS NULL AND @PrincipalName IS NULL
        THROW 50164, N'Give @AccountName, @FromAddress and/or @PrincipalName: what to withdraw.', 1;
    DECLARE @Pattern NVARCHAR(4000) = LOWER(LTRIM(RTRIM(@FromAddress)));
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        IF @AccountName IS NOT NULL
            DELETE b
            FROM mailq.ApplicationAccount AS b
            WHERE b.AppName = @AppName AND b.AccountName = @AccountName;
        IF @Pattern IS NOT NULL
            DELETE f
            FROM mailq.ApplicationFrom AS f
            WHERE f.AppName = @AppName AND f.FromPattern = @Pattern;
        IF @PrincipalName IS NOT NULL
            DELETE u
            FROM mailq.ApplicationPrincipal AS u
            WHERE u.AppName = @AppName AND u.PrincipalName = @PrincipalName;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
