/*
mailq.Suppressions: the suppression list as operators read it, now: AppName NULL
means every application of the account; IsActive 0 once ExpiresAtUtc passed
(the rules: mailq.SuppressionsAsOf).
*/
CREATE OR ALTER VIEW mailq.Suppressions
AS
SELECT
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
FROM mailq.SuppressionsAsOf(SYSUTCDATETIME()) AS s;
