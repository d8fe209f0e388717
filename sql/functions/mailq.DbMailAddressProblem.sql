/*
mailq.DbMailAddressProblem: the first thing wrong with a mailq.SendDbMail call's
addresses, named with sp_send_dbmail's parameters, or no row.
Parameters:  @recipients, @copy_recipients, @blind_copy_recipients, @from_address,
             @reply_to NVARCHAR(MAX) as SendDbMail received them
Returns:     at most one row: ReturnCode INT, Message NVARCHAR(2048): 50644 a list
             or address over its size; 50642 an invalid address, or more than one
             in @from_address or @reply_to; 50643 over 100 recipients in all.
Example:     SELECT p.ReturnCode FROM mailq.DbMailAddressProblem(N'b@', NULL, NULL, NULL, NULL) AS p;
*/
CREATE OR ALTER FUNCTION mailq.DbMailAddressProblem(
    @recipients NVARCHAR(MAX),
    @copy_recipients NVARCHAR(MAX),
    @blind_copy_recipients NVARCHAR(MAX),
    @from_address NVARCHAR(MAX),
    @reply_to NVARCHAR(MAX)
)
RETURNS TABLE
AS
RETURN
SELECT TOP (1)
    x.ReturnCode,
    x.Message
FROM (
    SELECT
        50644 AS ReturnCode,
        CONCAT(v.ParamName, N' is ', LEN(v.Value), N' characters long; the limit here is ', v.MaxLength, N'.')
        AS Message,
        v.Position
    FROM (
        VALUES
        (1, N'@recipients', @recipients, 4000), (2, N'@copy_recipients', @copy_recipients, 4000),
        (3, N'@blind_copy_recipients', @blind_copy_recipients, 4000),
        (4, N'@from_address', @from_address, 520), (5, N'@reply_to', @reply_to, 320)
    ) AS v(Position, ParamName, Value, MaxLength)
    WHERE LEN(v.Value) > v.MaxLength
    UNION ALL
    SELECT
        50642,
        CONCAT(v.ParamName, N': address ''', LEFT(a.Address, 100), N''' ', a.Problem, N'.'),
        10 + v.Position
    FROM (
        VALUES
        (1, N'@recipients', @recipients), (2, N'@copy_recipients', @copy_recipients),
        (3, N'@blind_copy_recipients', @blind_copy_recipients), (4, N'@from_address', @from_address),
        (5, N'@reply_to', @reply_to)
    ) AS v(Position, ParamName, Value)
    CROSS APPLY mailq.ParseAddressList(v.Value) AS a
    WHERE a.Problem IS NOT NULL
    UNION ALL
    SELECT 50642, CONCAT(v.ParamName, N' takes one address.'), 20 + v.Position
    FROM (VALUES (1, N'@from_address', @from_address), (2, N'@reply_to', @reply_to)) AS v(Position, ParamName, Value)
    WHERE (SELECT COUNT(*) FROM mailq.ParseAddressList(v.Value)) > 1
    UNION ALL
    SELECT
        50643,
        CONCAT(
            N'@recipients, @copy_recipients and @blind_copy_recipients name ', c.Recipients,
            N' recipients; the limit here is 100 per mail.'
        ),
        30
    FROM (
        SELECT COUNT(*) AS Recipients
        FROM (VALUES (@recipients), (@copy_recipients), (@blind_copy_recipients)) AS v(Value)
        CROSS APPLY mailq.ParseAddressList(v.Value)
    ) AS c
    WHERE c.Recipients > 100
) AS x
ORDER BY x.Position;
