/*
mailq.MailRecipientList: the recipients of a mail in the order the worker
sends them: To, then CC, then BCC, each list in its written order (inline,
so it costs nothing outside the query).
Parameters:  @ToAddress, @CC, @BCC NVARCHAR(MAX): ';'-separated lists as
             mailq.EnqueueMail stores them; NULL lists give no rows.
Returns:     ListNo INT (1 To, 2 CC, 3 BCC), Position INT (0-based place in
             its list), Entry NVARCHAR(MAX) (trimmed, as written, display
             name included), Address NVARCHAR(MAX) (lower-case addr-spec),
             RecipientNo BIGINT (1-based number of the distinct address in
             send order: the number a VERP or unsubscribe token carries,
             mailq_db.bounces.verp), IsFirst INT (1 for an address's first
             entry, 0 for a repeat).  Empty entries are skipped.
Split:       OPENJSON over the list turned into a JSON array keeps the order
             (its [key]); STRING_SPLIT promises none before SQL Server 2022.
Example:     SELECT r.RecipientNo, r.Address
             FROM mailq.MailRecipientList(N'a@x.org; B <b@y.org>', NULL, N'a@x.org') AS r;
*/
CREATE OR ALTER FUNCTION mailq.MailRecipientList(
    @ToAddress NVARCHAR(MAX),
    @CC NVARCHAR(MAX),
    @BCC NVARCHAR(MAX)
)
RETURNS TABLE
AS
RETURN
SELECT
    e.ListNo,
    e.Position,
    e.Entry,
    e.Address,
    DENSE_RANK() OVER (ORDER BY e.FirstKey) AS RecipientNo,
    IIF(e.Occurrence = 1, 1, 0) AS IsFirst
FROM (
    SELECT
        p.ListNo,
        p.Position,
        p.Entry,
        p.Address,
        MIN(CAST(p.ListNo AS BIGINT) * 1000000 + p.Position) OVER (PARTITION BY p.Address) AS FirstKey,
        ROW_NUMBER() OVER (PARTITION BY p.Address ORDER BY p.ListNo, p.Position) AS Occurrence
    FROM (
        SELECT
            s.ListNo,
            s.Position,
            s.Entry,
            -- "Name <address>": the address is what stands between the first '<' and the final '>'.
            LOWER(IIF(
                s.Entry LIKE N'%<%>',
                SUBSTRING(s.Entry, CHARINDEX(N'<', s.Entry) + 1, LEN(s.Entry) - CHARINDEX(N'<', s.Entry) - 1),
                s.Entry
            )) AS Address
        FROM (
            SELECT
                l.ListNo,
                CAST(j.[key] AS INT) AS Position,
                LTRIM(RTRIM(j.[value])) AS Entry
            FROM (VALUES (1, @ToAddress), (2, @CC), (3, @BCC)) AS l(ListNo, List)
            CROSS APPLY OPENJSON(N'["' + REPLACE(STRING_ESCAPE(l.List, 'json'), N';', N'","') + N'"]') AS j
            WHERE l.List IS NOT NULL
        ) AS s
        WHERE s.Entry <> N''
    ) AS p
) AS e;
