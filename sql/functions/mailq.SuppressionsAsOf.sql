/*
mailq.SuppressionsAsOf: the suppression list as operators read it, at one moment;
the one place of its rules: AppName NULL means every application of the account
(stored N''), IsActive 0 once ExpiresAtUtc has passed @AsOfUtc.  Inline: it expands
into the caller's statement (the view mailq.Suppressions, mailq.ListSuppressions).
Parameters:  @AsOfUtc DATETIME2(7): the moment IsActive is judged at (7 digits, so
             the view's SYSUTCDATETIME() is compared unrounded).
Returns:     AccountName, AppName, Address, Reason, Source, Detail, MailID,
             CreatedAtUtc, UpdatedAtUtc, ExpiresAtUtc, IsActive BIT; one row per
             mailq.Suppression row, no hints (the caller's isolation applies).
Example:     SELECT s.Address FROM mailq.SuppressionsAsOf(SYSUTCDATETIME()) AS s WHERE s.IsActive = 1;
*/
CREATE OR ALTER FUNCTION mailq.SuppressionsAsOf(@AsOfUtc DATETIME2(7))
RETURNS TABLE
AS
RETURN
SELECT
    s.AccountName,
    NULLIF(s.AppName, N'') AS AppName,
    s.Address,
    s.Reason,
    s.Source,
    s.Detail,
    s.MailID,
    s.CreatedAtUtc,
    s.UpdatedAtUtc,
    s.ExpiresAtUtc,
    CAST(IIF(s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @AsOfUtc, 1, 0) AS BIT) AS IsActive
FROM mailq.Suppression AS s;
