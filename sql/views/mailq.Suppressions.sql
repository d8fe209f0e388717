/*
mailq.Suppressions: the suppression list as operators read it: AppName NULL
means every application of the account; IsActive 0 once ExpiresAtUtc passed.
*/
CREATE OR ALTER VIEW mailq.Suppressions
AS
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
    CAST(IIF(s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > SYSUTCDATETIME(), 1, 0) AS BIT) AS IsActive
FROM mailq.Suppression AS s;
