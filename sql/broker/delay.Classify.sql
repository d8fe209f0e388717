/*
delay.Classify: one platform row (or one dbo.InitiateDelayExecution call) -> its
allow-list entry, delay and values as the target will get them, or why it is refused.
Names are matched against delay.AllowedProcedure only, never executed, never
against the catalog (a listed procedure that changed is Held when due, not refused):
"schema.proc" matches that entry; a bare "proc" only the one listed with
AllowBareName = 1, never through a default schema.  PARSENAME takes a sysname and
would cut a longer string: longer names are refused first.
Parameters:  @Name NVARCHAR(4000); @Delay NVARCHAR(40) (F108218 as text: an adopted table
             may type it otherwise; NULL counts as 0); @P1 ... @P5 NVARCHAR(MAX)
Result set:  one row: RefusalNumber, RefusalMessage (NULL: schedule it; 50302 delay not
             an integer 0-31,536,000; 50303 a value over 200 characters, never cut;
             50304 a name empty, over 128 characters or not a name; 50305 three or four
             parts; 50306 not listed), SchemaName, ProcedureName, TargetName
             NVARCHAR(400), DelaySeconds, Param1 ... Param5 NVARCHAR(200)
Example:     SELECT c.RefusalNumber FROM delay.Classify(N'TCXG', N'60', N'A-1', NULL, NULL, NULL, NULL) AS c;
*/
CREATE OR ALTER FUNCTION delay.Classify(
    @Name NVARCHAR(4000), @Delay NVARCHAR(40),
    @P1 NVARCHAR(MAX), @P2 NVARCHAR(MAX), @P3 NVARCHAR(MAX), @P4 NVARCHAR(MAX), @P5 NVARCHAR(MAX)
)
RETURNS TABLE
AS
RETURN
WITH Checked AS (
    SELECT
        i.DelaySeconds, a.SchemaName, a.ProcedureName,
        RefusalNumber = CASE
            WHEN i.DelaySeconds IS NULL OR i.DelaySeconds NOT BETWEEN 0 AND 31536000 THEN 50302
            -- LEN(x + N'.') - 1 counts trailing blanks, which LEN alone ignores.
            WHEN LEN(@P1 + N'.') > 201 OR LEN(@P2 + N'.') > 201 OR LEN(@P3 + N'.') > 201
                OR LEN(@P4 + N'.') > 201 OR LEN(@P5 + N'.') > 201 THEN 50303
            WHEN i.Part1 IS NULL THEN 50304
            WHEN i.Parts34 IS NOT NULL THEN 50305
            WHEN a.SchemaName IS NULL THEN 50306
        END
    FROM (
        SELECT
            DelaySeconds = IIF(@Delay IS NULL, 0, TRY_CONVERT(INT, @Delay)),
            Part1 = IIF(DATALENGTH(@Name) BETWEEN 2 AND 256, PARSENAME(@Name, 1), NULL),
            Part2 = IIF(DATALENGTH(@Name) BETWEEN 2 AND 256, PARSENAME(@Name, 2), NULL),
            Parts34 = IIF(DATALENGTH(@Name) BETWEEN 2 AND 256, COALESCE(PARSENAME(@Name, 3), PARSENAME(@Name, 4)), NULL)
    ) AS i
    -- At most one entry: (SchemaName, ProcedureName) is unique, and so is a bare name.
    OUTER APPLY (
        SELECT ap.SchemaName, ap.ProcedureName FROM delay.AllowedProcedure AS ap
        WHERE
            i.Parts34 IS NULL AND ap.ProcedureName = i.Part1
            AND (ap.SchemaName = i.Part2 OR (i.Part2 IS NULL AND ap.AllowBareName = 1))
    ) AS a
)

SELECT
    c.RefusalNumber,
    RefusalMessage = CASE c.RefusalNumber
        WHEN 50302 THEN CONCAT(N'delay ', LEFT(@Delay, 40), N' is not 0-31536000 seconds')
        WHEN 50303 THEN N'a value is longer than the target''s 200 characters'
        WHEN 50304 THEN CONCAT(N'"', LEFT(@Name, 200), N'" is empty, longer than 128 characters or not a name')
        WHEN 50305 THEN CONCAT(N'"', LEFT(@Name, 200), N'" has three or four parts')
        WHEN 50306 THEN CONCAT(N'"', LEFT(@Name, 200), N'" is not on the allow-list (delay.AllowedProcedure)')
    END,
    c.SchemaName, c.ProcedureName, TargetName = CAST(LEFT(@Name, 400) AS NVARCHAR(400)), c.DelaySeconds,
    Param1 = CAST(@P1 AS NVARCHAR(200)), Param2 = CAST(@P2 AS NVARCHAR(200)), Param3 = CAST(@P3 AS NVARCHAR(200)),
    Param4 = CAST(@P4 AS NVARCHAR(200)), Param5 = CAST(@P5 AS NVARCHAR(200))
FROM Checked AS c;
