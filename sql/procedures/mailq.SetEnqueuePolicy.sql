/*
mailq.SetEnqueuePolicy: whether a database user no application binding covers
(no mailq.ApplicationPrincipal row) may enqueue.  db_owner and MailqAdmin only: the
procedure checks the caller itself, whatever EXECUTE was granted.
Parameters:  @AllowUnmappedEnqueuers BIT, required: 0 = refuse such a user with
             50500 (a new installation's setting); 1 = the documented opt-in:
             such a user enqueues unbound, through any account as any From address.
Result set:  none.
Errors:      50501 @AllowUnmappedEnqueuers NULL; 50502 the caller is neither a
             member of db_owner nor of MailqAdmin.  Nothing is written.
Transaction: its own or the caller's; an error dooms the caller's (XACT_ABORT ON).
Isolation:   READ COMMITTED, set here.
Lock order:  mailq.EnqueuePolicy only (one row).
Example:     EXEC mailq.SetEnqueuePolicy @AllowUnmappedEnqueuers = 0;
*/
CREATE OR ALTER PROCEDURE mailq.SetEnqueuePolicy
    @AllowUnmappedEnqueuers BIT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF @AllowUnmappedEnqueuers IS NULL
        THROW 50501, N'@AllowUnmappedEnqueuers is required: 0 refuses unmapped enqueuers, 1 allows them.', 1;
    -- IS_ROLEMEMBER checks the caller's own user (this module has no EXECUTE AS).
    IF COALESCE(IS_ROLEMEMBER(N'db_owner'), 0) = 0 AND COALESCE(IS_ROLEMEMBER(N'MailqAdmin'), 0) = 0
        THROW 50502, N'mailq.SetEnqueuePolicy is for members of db_owner or MailqAdmin.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        UPDATE p
        SET
            p.AllowUnmappedEnqueuers = @AllowUnmappedEnqueuers,
            p.ChangedAtUtc = SYSUTCDATETIME(),
            p.ChangedBy = LEFT(ORIGINAL_LOGIN(), 128)
        FROM mailq.EnqueuePolicy AS p
        WHERE p.PolicyId = 1;
        IF @@ROWCOUNT = 0
            INSERT INTO mailq.EnqueuePolicy (PolicyId, AllowUnmappedEnqueuers, ChangedBy)
            VALUES (1, @AllowUnmappedEnqueuers, LEFT(ORIGINAL_LOGIN(), 128));
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
