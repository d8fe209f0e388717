/*
mailq.ParseIDList: the distinct mail IDs of a procedure's @ID or @IDList (a JSON
array of integers, validated by the caller: mailq.LockLeasedMail).
Returns:     ID BIGINT.
Example:     SELECT l.ID FROM mailq.ParseIDList(NULL, N'[1, 2, 3]') AS l;
*/
CREATE OR ALTER FUNCTION mailq.ParseIDList(@ID BIGINT, @IDList NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN (
    SELECT @ID AS ID
    WHERE @ID IS NOT NULL
    UNION
    SELECT TRY_CAST(j.[value] AS BIGINT) AS ID
    FROM OPENJSON(@IDList) AS j
    WHERE j.[type] = 2 AND TRY_CAST(j.[value] AS BIGINT) IS NOT NULL
);
