/*
delay.ResolveTarget: resolves a requested target name against the allow-list
and sys.objects; the one place where a name becomes something executable.
Parameters:  @Name NVARCHAR(4000): a name as the caller or the platform wrote it
Result set:  exactly one row:
             RefusalNumber INT: NULL when the name resolves, else why not:
                 50304 empty, longer than 128 characters, or not a valid name
                 50305 a three- or four-part name (another database or server)
                 50306 not on the allow-list (delay.AllowedProcedure)
                 50307 listed, but sys.objects no longer holds that procedure
                       with the listed object_id, schema and name (dropped,
                       recreated, moved, or renamed): list it again
             RefusalMessage NVARCHAR(400): the reason in words, naming the value
             SchemaName, ProcedureName SYSNAME, ObjectId INT: the catalog's
                 names of the procedure to run (NULL when refused)
Rules:       "schema.proc" matches the entry with that schema and name only.
             A bare "proc" matches only the entry listed with AllowBareName = 1
             (at most one per name); it never resolves through a default schema.
             Names are compared, never executed: an injected string such as
             N'x];DROP TABLE t;--' or N'dbo.p; EXEC xp_cmdshell ''x''' matches no
             listed procedure.  The caller builds the EXEC from the returned
             catalog names with QUOTENAME.
             PARSENAME takes a sysname (NVARCHAR(128)) and would silently cut a
             longer string, so longer names are refused before it is called.
             Runs in its caller's security context (an inline function): the
             callers run as dbo (EXECUTE AS OWNER) and so see every procedure.
Example:     SELECT RefusalNumber, SchemaName, ProcedureName, ObjectId
             FROM delay.ResolveTarget(N'dbo.TCXG');
*/
CREATE OR ALTER FUNCTION delay.ResolveTarget(@Name NVARCHAR(4000))
RETURNS TABLE
AS
RETURN
SELECT
    RefusalNumber = CASE
        WHEN n.Part1 IS NULL THEN 50304
        WHEN n.Part3 IS NOT NULL OR n.Part4 IS NOT NULL THEN 50305
        WHEN a.AllowedProcedureId IS NULL THEN 50306
        WHEN o.object_id IS NULL THEN 50307
    END,
    RefusalMessage = CASE
        WHEN n.Part1 IS NULL THEN CONCAT(
                N'target name "', LEFT(@Name, 200), N'" is empty, longer than 128 characters or not a valid name'
            )
        WHEN n.Part3 IS NOT NULL OR n.Part4 IS NOT NULL THEN CONCAT(
                N'target name "', LEFT(@Name, 200),
                N'" has three or four parts; only schema.procedure or a bare name is allowed'
            )
        WHEN a.AllowedProcedureId IS NULL THEN CONCAT(
                N'target name "', LEFT(@Name, 200), N'" is not on the allow-list (delay.AllowedProcedure)'
            )
        WHEN o.object_id IS NULL THEN CONCAT(
                N'target name "', LEFT(@Name, 200), N'" was listed as ', QUOTENAME(a.SchemaName), N'.',
                QUOTENAME(a.ProcedureName), N', which no longer exists with the listed identity; list it again'
            )
    END,
    SchemaName = CASE WHEN o.object_id IS NOT NULL THEN a.SchemaName END,
    ProcedureName = CASE WHEN o.object_id IS NOT NULL THEN a.ProcedureName END,
    ObjectId = o.object_id
FROM (
    SELECT
        Part1 = CASE WHEN ok.IsShort = 1 THEN PARSENAME(@Name, 1) END,
        Part2 = CASE WHEN ok.IsShort = 1 THEN PARSENAME(@Name, 2) END,
        Part3 = CASE WHEN ok.IsShort = 1 THEN PARSENAME(@Name, 3) END,
        Part4 = CASE WHEN ok.IsShort = 1 THEN PARSENAME(@Name, 4) END
    FROM (
        -- DATALENGTH, not LEN: LEN ignores trailing blanks.  2-256 bytes = 1-128 characters.
        SELECT IsShort = CASE WHEN DATALENGTH(@Name) BETWEEN 2 AND 256 THEN 1 ELSE 0 END
    ) AS ok
) AS n
OUTER APPLY (
    -- At most one row: (SchemaName, ProcedureName) is unique, and so is
    -- ProcedureName among the entries that allow a bare name.
    SELECT
        ap.AllowedProcedureId,
        ap.SchemaName,
        ap.ProcedureName,
        ap.ObjectId
    FROM delay.AllowedProcedure AS ap
    WHERE
        n.Part3 IS NULL
        AND n.Part4 IS NULL
        AND ap.ProcedureName = n.Part1
        AND (ap.SchemaName = n.Part2 OR (n.Part2 IS NULL AND ap.AllowBareName = 1))
) AS a
LEFT OUTER JOIN sys.objects AS o
    ON
        a.ObjectId = o.object_id
        AND o.type = 'P'
        AND o.is_ms_shipped = 0
        AND a.ProcedureName = o.name
        AND o.schema_id = SCHEMA_ID(a.SchemaName);
