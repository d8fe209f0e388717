/*
mailq.FilterSuppressedRecipients: a mail's recipient lists without the addresses
suppressed for its account (AppName N'') or its application and not expired
(mailq.Suppression); inline, one seek on PK_Suppression per recipient entry.
Parameters:  @AccountName NVARCHAR(128), @AppName NVARCHAR(128) (NULL: none),
             @ToAddress, @CC, @BCC NVARCHAR(MAX) as stored.
Returns:     one row: SuppressedCount INT, EntriesLeft INT, ToAddress, CC, BCC
             (without them, '; ' joined, NULL when empty), Suppressed NVARCHAR(MAX).
Locking:     HOLDLOCK: in the caller's transaction the ranges read stay S-locked,
             so mailq.ApplySuppressions (insert, then sweep the queue) either waits
             for this mail and finds it, or committed first and is seen here.
Example:     SELECT f.ToAddress, f.Suppressed
             FROM mailq.FilterSuppressedRecipients(N'news', NULL, N'a@x.org', NULL, NULL) AS f;
*/
CREATE OR ALTER FUNCTION mailq.FilterSuppressedRecipients(
    @AccountName NVARCHAR(128),
    @AppName NVARCHAR(128),
    @ToAddress NVARCHAR(MAX),
    @CC NVARCHAR(MAX),
    @BCC NVARCHAR(MAX)
)
RETURNS TABLE
AS
RETURN
SELECT
    ISNULL(SUM(r.IsSuppressed), 0) AS SuppressedCount,
    ISNULL(SUM(1 - r.IsSuppressed), 0) AS EntriesLeft,
    STRING_AGG(IIF(r.ListNo = 1 AND r.IsSuppressed = 0, r.Entry, NULL), N'; ')
    WITHIN GROUP (ORDER BY r.ListNo, r.Position) AS ToAddress,
    STRING_AGG(IIF(r.ListNo = 2 AND r.IsSuppressed = 0, r.Entry, NULL), N'; ')
    WITHIN GROUP (ORDER BY r.ListNo, r.Position) AS CC,
    STRING_AGG(IIF(r.ListNo = 3 AND r.IsSuppressed = 0, r.Entry, NULL), N'; ')
    WITHIN GROUP (ORDER BY r.ListNo, r.Position) AS BCC,
    STRING_AGG(IIF(r.IsSuppressed = 1 AND r.IsFirst = 1, r.Address, NULL), N'; ')
    WITHIN GROUP (ORDER BY r.ListNo, r.Position) AS Suppressed
FROM (
    SELECT
        l.ListNo,
        l.Position,
        l.Entry,
        l.Address,
        l.IsFirst,
        IIF(EXISTS (
            SELECT 1
            FROM mailq.Suppression AS s WITH (HOLDLOCK)  -- see Locking above
            WHERE
                s.AccountName = @AccountName
                AND s.Address = l.Address
                AND s.AppName IN (N'', ISNULL(@AppName, N''))
                AND (s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > SYSUTCDATETIME())
        ), 1, 0) AS IsSuppressed
    FROM mailq.MailRecipientList(@ToAddress, @CC, @BCC) AS l
) AS r;
