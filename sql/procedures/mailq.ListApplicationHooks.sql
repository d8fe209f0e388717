/*
mailq.ListApplicationHooks: the registered hooks and where each stands
(docs/hooks.md; `mailq-db hooks list`).
Parameters:  @AppName NVARCHAR(128) = NULL: one application, NULL = all.
Result set:  one row per hook, by AppName: AppName, HookProcedure, ObjectId,
             Pinned BIT (0: changed since registration; the dispatcher suspends
             it), CursorEventID, FailingEventID, FailCount, MaxAttempts, LastError,
             LastRunAtUtc, RegisteredAtUtc, RegisteredBy, Failures INT (rows in
             mailq.ApplicationHookFailure), LastFailureAtUtc.
Errors:      none.
Transaction: opens none, writes nothing.
Isolation:   the caller's (a report).
Lock order:  mailq.ApplicationHook, then mailq.ApplicationHookFailure (shared, brief).
Example:     EXEC mailq.ListApplicationHooks;
*/
CREATE OR ALTER PROCEDURE mailq.ListApplicationHooks
    @AppName NVARCHAR(128) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- Procedures a hook may resolve to: dbo-owned schema, no other owner.
    DECLARE @Live TABLE (
        ObjectId INT NOT NULL PRIMARY KEY,
        SchemaName SYSNAME NOT NULL,
        ProcedureName SYSNAME NOT NULL
    );
    INSERT INTO @Live (ObjectId, SchemaName, ProcedureName)
    SELECT
        o.object_id AS ObjectId,
        sch.name AS SchemaName,
        o.name AS ProcedureName
    FROM sys.objects AS o
    INNER JOIN sys.schemas AS sch ON o.schema_id = sch.schema_id
    WHERE o.type = 'P' AND sch.principal_id = 1 AND COALESCE(o.principal_id, 1) = 1;
    WITH Failures AS (
        SELECT
            x.AppName,
            COUNT(*) AS Failures,
            MAX(x.RecordedAtUtc) AS LastFailureAtUtc
        FROM mailq.ApplicationHookFailure AS x
        GROUP BY x.AppName
    )

    SELECT
        h.AppName,
        CONCAT(QUOTENAME(h.SchemaName), N'.', QUOTENAME(h.ProcedureName)) AS HookProcedure,
        h.ObjectId,
        CAST(IIF(
            l.ObjectId IS NOT NULL AND HASHBYTES('SHA2_256', OBJECT_DEFINITION(h.ObjectId)) = h.DefinitionHash, 1, 0
        ) AS BIT) AS Pinned,
        h.CursorEventID,
        h.FailingEventID,
        h.FailCount,
        h.MaxAttempts,
        h.LastError,
        h.LastRunAtUtc,
        h.RegisteredAtUtc,
        h.RegisteredBy,
        COALESCE(f.Failures, 0) AS Failures,
        f.LastFailureAtUtc
    FROM mailq.ApplicationHook AS h
    LEFT JOIN @Live AS l
        ON h.ObjectId = l.ObjectId AND h.SchemaName = l.SchemaName AND h.ProcedureName = l.ProcedureName
    LEFT JOIN Failures AS f ON h.AppName = f.AppName
    WHERE @AppName IS NULL OR h.AppName = @AppName
    ORDER BY h.AppName;
END;
