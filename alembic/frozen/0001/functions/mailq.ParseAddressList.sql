/*
mailq.ParseAddressList: splits a ';'-separated list of e-mail addresses and
says what is wrong with each (inline, so it costs nothing outside the query).
Parameters:  @List NVARCHAR(MAX), NULL gives no rows
Returns:     Address NVARCHAR(MAX) (trimmed of spaces), Problem NVARCHAR(100)
             (NULL when the address is acceptable).  Empty entries are skipped.
Rules:       no CR, LF or other control character (header injection); no white
             space; at most 254 characters (RFC 5321); exactly one '@' with a
             non-empty local part and domain; no '<', '>', ',', ';', '"', '(',
             ')' or '\' (display names are not accepted in address lists); the
             domain neither starts nor ends with '.' nor contains '..'.
             Non-ASCII addresses are accepted here; the worker sends them only
             to servers that offer SMTPUTF8.
Example:     SELECT a.Address, a.Problem FROM mailq.ParseAddressList(N'a@x.org; b@') AS a;
*/
CREATE OR ALTER FUNCTION mailq.ParseAddressList(@List NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN
SELECT
    a.Address,
    CASE
        WHEN a.Address LIKE N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%'
            THEN N'contains CR, LF or another control character'
        WHEN a.Address LIKE N'% %' OR a.Address LIKE N'%' + NCHAR(160) + N'%'
            THEN N'contains white space'
        WHEN LEN(a.Address) > 254 THEN N'is longer than 254 characters'
        WHEN a.Address NOT LIKE N'%_@_%' THEN N'has no local part or no domain'
        WHEN a.Address LIKE N'%@%@%' THEN N'has more than one @'
        WHEN a.Address LIKE N'%[<>,;"()\]%' THEN N'contains a character not allowed in an address'
        WHEN a.Address LIKE N'%@.%' OR a.Address LIKE N'%.' OR a.Address LIKE N'%@%..%'
            THEN N'has a malformed domain'
    END AS Problem
FROM (
    SELECT LTRIM(RTRIM(s.value)) AS Address
    FROM STRING_SPLIT(@List, N';') AS s
) AS a
WHERE a.Address <> N'';
