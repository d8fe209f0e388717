/*
mailq.FilterSuppressedRecipients: a mail's recipient lists without the
addresses suppressed for its account and application (mailq.Suppression),
as one row (inline: one seek on PK_Suppression per recipient entry).
Parameters:  @AccountName NVARCHAR(128), @AppName NVARCHAR(128) (NULL: no
             application), @ToAddress, @CC, @BCC NVARCHAR(MAX) as stored.
Returns:     one row: SuppressedCount INT (entries removed), EntriesLeft INT,
             ToAddress, CC, BCC NVARCHAR(MAX) (the lists without them, '; '
             joined, NULL when a list is left empty), Suppressed NVARCHAR(MAX)
             (the removed addresses, '; ' joined, NULL when none).
             A row applies when AppName is N'' (the whole account) or the
             mail's application, and it has not expired.
Locking:     HOLDLOCK: inside the caller's transaction the key ranges read
             stay share-locked to its end, so a suppression of one of these
             addresses (mailq.ApplySuppressions inserts first, then sweeps the
             queue) waits for this mail to commit and then finds it, or was
             committed first and is seen here: a mail never slips between the
             check and the sweep.  mailq.Suppression is written rarely (bounce
             reader, unsubscribes, operators); readers never block each other.
Example:     SELECT f.ToAddress, f.Suppressed
             FROM mailq.FilterSuppressedRecipients(N'news', NULL, N'a@x.org; b@y.org', NULL, NULL) AS f;
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
