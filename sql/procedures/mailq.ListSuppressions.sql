/*
mailq.ListSuppressions: the suppression list, newest change first, for an
operator or an export (`mailq-db suppressions list`).
Parameters:  @AccountName NVARCHAR(128), default NULL: every account;
             @Address NVARCHAR(320), default NULL: every address (with
             @AccountName: one seek on PK_Suppression);
             @Reason NVARCHAR(16), default NULL: every reason;
             @IncludeExpired BIT, default 0;
             @MaxRows INT 1-100000, default 1000.
Result set:  AccountName, AppName (NULL: every application of the account),
             Address, Reason, Source, Detail, MailID, CreatedAtUtc,
             UpdatedAtUtc, ExpiresAtUtc, IsActive BIT.
Errors:      50613 @MaxRows out of range.
Transaction: none of its own; reads only.
Isolation:   sets READ COMMITTED itself (no key-range locks under a SERIALIZABLE
             caller, no stale snapshot under SNAPSHOT; a report, locks kept by none).
Reads:       mailq.SuppressionsAsOf(@Now), the rules of the view mailq.Suppressions.
Lock order:  mailq.Suppression only.
Example:     EXEC mailq.ListSuppressions @AccountName = N'news', @Reason = N'Complaint';
*/
CREATE OR ALTER PROCEDURE mailq.ListSuppressions
    @AccountName NVARCHAR(128) = NULL,
    @Address NVARCHAR(400) = NULL,
    @Reason NVARCHAR(16) = NULL,
    @IncludeExpired BIT = 0,
    @MaxRows INT = 1000
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @MaxRows = ISNULL(@MaxRows, 1000);
    IF @MaxRows NOT BETWEEN 1 AND 100000
    BEGIN
        SET @Msg = CONCAT(N'@MaxRows must be 1-100000; got ', @MaxRows, N'.');
        THROW 50613, @Msg, 1;
    END;
    SET @Address = LOWER(LTRIM(RTRIM(@Address)));
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    SELECT TOP (@MaxRows)
        s.AccountName,
        s.AppName,
        s.Address,
        s.Reason,
        s.Source,
        s.Detail,
        s.MailID,
        s.CreatedAtUtc,
        s.UpdatedAtUtc,
        s.ExpiresAtUtc,
        s.IsActive
    FROM mailq.SuppressionsAsOf(@Now) AS s
    WHERE
        (@AccountName IS NULL OR s.AccountName = @AccountName)
        AND (@Address IS NULL OR s.Address = @Address)
        AND (@Reason IS NULL OR s.Reason = @Reason)
        AND (ISNULL(@IncludeExpired, 0) = 1 OR s.IsActive = 1)
    ORDER BY s.UpdatedAtUtc DESC, s.AccountName ASC, s.Address ASC
    OPTION (RECOMPILE);  -- optional filters: a plan per call, so a given account+address seeks
END;
