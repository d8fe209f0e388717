/*
mailq.ParseAddressList: splits a ';'-separated recipient list and says what is
wrong with each entry (inline).  An entry is an address or 'Name <address>'.
Parameters:  @List NVARCHAR(MAX), NULL gives no rows
Returns:     DisplayName (NULL for a bare address), Address, Problem NVARCHAR(100)
             (NULL when acceptable); entries trimmed, empty ones skipped.
Rules:       no control character (header injection); display name without '<'
             or '>', at most 200 characters; address without white space, at
             most 254 characters, one '@' between a non-empty local part and
             domain, none of < > , " ( ) \, domain not starting or ending with
             '.' nor containing '..'.  Non-ASCII is accepted (SMTPUTF8 needed).
Example:     SELECT a.Address, a.Problem FROM mailq.ParseAddressList(N'a@x.org; c@') AS a;
*/
CREATE OR ALTER FUNCTION mailq.ParseAddressList(@List NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN
SELECT
    p.DisplayName,
    p.Address,
    CASE
        -- Binary collation: LIKE ranges are code points, control characters never ignored.
        WHEN p.Entry COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%'
            THEN N'contains CR, LF or another control character'
        WHEN p.DisplayName LIKE N'%[<>]%' THEN N'has a malformed display name'
        WHEN LEN(p.DisplayName) > 200 THEN N'has a display name longer than 200 characters'
        WHEN p.Address LIKE N'% %' OR p.Address LIKE N'%' + NCHAR(160) + N'%'
            THEN N'contains white space'
        WHEN LEN(p.Address) > 254 THEN N'is longer than 254 characters'
        WHEN p.Address NOT LIKE N'%_@_%' THEN N'has no local part or no domain'
        WHEN p.Address LIKE N'%@%@%' THEN N'has more than one @'
        WHEN p.Address LIKE N'%[<>,"()\]%' THEN N'contains a character not allowed in an address'
        WHEN p.Address LIKE N'%@.%' OR p.Address LIKE N'%.' OR p.Address LIKE N'%@%..%'
            THEN N'has a malformed domain'
    END AS Problem
FROM (
    SELECT
        e.Entry,
        -- "Name <address>": the display name is what stands before the first '<'.
        IIF(
            e.Entry LIKE N'%<%>',
            NULLIF(RTRIM(LEFT(e.Entry, CHARINDEX(N'<', e.Entry) - 1)), N''),
            NULL
        ) AS DisplayName,
        IIF(
            e.Entry LIKE N'%<%>',
            SUBSTRING(e.Entry, CHARINDEX(N'<', e.Entry) + 1, LEN(e.Entry) - CHARINDEX(N'<', e.Entry) - 1),
            e.Entry
        ) AS Address
    FROM (
        SELECT LTRIM(RTRIM(s.value)) AS Entry
        FROM STRING_SPLIT(@List, N';') AS s
    ) AS e
    WHERE e.Entry <> N''
) AS p;
