/*
delay.CheckTarget: is a task's target, right now, the procedure that was listed?
delay.RunTask reads it before the call and, in the call's transaction, after it:
the same ObjectId, ModifyDate and DefinitionHash both times means nothing
altered, dropped or recreated it in between (docs: "The check and the call").
Parameters:  @SchemaName, @ProcedureName SYSNAME: the entry the task was scheduled for
Result set:  one row: Verdict NVARCHAR(8): Run | Held (listed, but gone, recreated,
             moved, or its definition differs from the pin or cannot be read) |
             Refused (no entry: never listed, or disallowed); Reason INT (50307 gone
             or recreated, 50340 changed, 50306 not listed), ObjectId, ModifyDate,
             DefinitionHash, MaxReaders
Security:    the catalog shows a procedure only to whoever may see it: callers run as dbo.
Example:     SELECT Verdict, Reason FROM delay.CheckTarget(N'dbo', N'TCXG');
*/
CREATE OR ALTER FUNCTION delay.CheckTarget(@SchemaName SYSNAME, @ProcedureName SYSNAME)
RETURNS TABLE
AS
RETURN
SELECT
    Verdict = CASE
        WHEN a.ObjectId IS NULL THEN N'Refused'
        WHEN o.object_id IS NULL OR h.CurrentHash IS NULL OR h.CurrentHash <> a.DefinitionHash THEN N'Held'
        ELSE N'Run'
    END,
    Reason = CASE
        WHEN a.ObjectId IS NULL THEN 50306
        WHEN o.object_id IS NULL THEN 50307
        WHEN h.CurrentHash IS NULL OR h.CurrentHash <> a.DefinitionHash THEN 50340
    END,
    ObjectId = o.object_id,
    ModifyDate = o.modify_date,
    DefinitionHash = h.CurrentHash,
    a.MaxReaders
FROM (VALUES (@SchemaName, @ProcedureName)) AS req(SchemaName, ProcedureName)
OUTER APPLY (
    SELECT ap.SchemaName, ap.ProcedureName, ap.ObjectId, ap.DefinitionHash, ap.MaxReaders
    FROM delay.AllowedProcedure AS ap
    WHERE ap.SchemaName = req.SchemaName AND ap.ProcedureName = req.ProcedureName
) AS a
LEFT OUTER JOIN sys.objects AS o
    ON
        a.ObjectId = o.object_id AND o.type = 'P' AND o.is_ms_shipped = 0
        AND a.ProcedureName = o.name AND o.schema_id = SCHEMA_ID(a.SchemaName)
-- The pin: SHA2_256 of the current text (NULL when there is none, e.g. WITH ENCRYPTION).
OUTER APPLY (VALUES (HASHBYTES('SHA2_256', OBJECT_DEFINITION(o.object_id)))) AS h(CurrentHash);
