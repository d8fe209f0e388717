/*
mailq.ClaimDbMailQuery: leases one waiting mailq.SendDbMail query to a query runner: the oldest
Pending, or a Running one whose lease passed (its runner died: at-least-once).
Parameters:  @LockToken UNIQUEIDENTIFIER, required; @LeaseSeconds INT 10-3600, default 300
Result set:  zero or one row: MailItemID, MailID, Query, Database, RequestUser, RequestUserSid
             (whom to impersonate, and the SID to find), the sp_send_dbmail query options, Attempts.
Errors:      50660 @LockToken missing or @LeaseSeconds not 10-3600.
Transaction: one statement.  Isolation: sets READ COMMITTED.  Lock order: mailq.DbMailItem only.
Example:     EXEC mailq.ClaimDbMailQuery @LockToken = @T, @LeaseSeconds = 300;
*/
CREATE OR ALTER PROCEDURE mailq.ClaimDbMailQuery
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT = 300
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF @LockToken IS NULL OR COALESCE(@LeaseSeconds, 0) NOT BETWEEN 10 AND 3600
        THROW 50660, N'@LockToken is required and @LeaseSeconds must be 10-3600.', 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    WITH NextQuery AS (
        SELECT TOP (1)
            i.MailItemID, i.MailID, i.Query, i.ExecuteQueryDatabase, i.RequestUser, i.RequestUserSid,
            i.AttachQueryResultAsFile, i.QueryAttachmentFilename, i.QueryResultHeader, i.QueryResultWidth,
            i.QueryResultSeparator, i.ExcludeQueryOutput, i.AppendQueryError, i.QueryNoTruncate,
            i.QueryResultNoPadding, i.QueryResultFormat, i.QueryState, i.QueryDueAtUtc, i.QueryLockToken,
            i.QueryAttempts
        FROM mailq.DbMailItem AS i WITH (READPAST, UPDLOCK, ROWLOCK)
        -- READPAST, UPDLOCK, ROWLOCK: claim while reading, skipping others' rows.
        WHERE i.QueryState IN (N'Pending', N'Running') AND i.QueryDueAtUtc <= @Now
        ORDER BY i.QueryDueAtUtc, i.MailItemID
    )

    UPDATE NextQuery
    SET
        QueryState = N'Running',
        QueryLockToken = @LockToken,
        QueryDueAtUtc = DATEADD(SECOND, @LeaseSeconds, @Now),
        QueryAttempts = QueryAttempts + 1
    OUTPUT
        inserted.MailItemID, inserted.MailID, inserted.Query, inserted.ExecuteQueryDatabase AS [Database],
        inserted.RequestUser, inserted.RequestUserSid, inserted.AttachQueryResultAsFile,
        inserted.QueryAttachmentFilename, inserted.QueryResultHeader, inserted.QueryResultWidth,
        inserted.QueryResultSeparator, inserted.ExcludeQueryOutput, inserted.AppendQueryError,
        inserted.QueryNoTruncate, inserted.QueryResultNoPadding, inserted.QueryResultFormat,
        inserted.QueryAttempts AS Attempts;
END;
