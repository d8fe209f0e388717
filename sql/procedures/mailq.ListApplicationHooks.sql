/*
mailq.ListApplicationHooks: the registered hooks and where each stands
(docs/hooks.md; `mailq-db hooks list`).
Parameters:  @AppName NVARCHAR(128) = NULL: one application, NULL = all.
Result set:  one row per hook, by AppName: AppName, HookProcedure, ObjectId,
             Pinned BIT (1: the procedure is still the one registered, same
             object, schema, name, owner and definition; 0: the dispatcher
             suspends it until mailq.SetApplicationHook re-registers it),
             CursorEventID, FailingEventID, FailCount, MaxAttempts, LastError,
             LastRunAtUtc, RegisteredAtUtc, RegisteredBy, Failures INT (rows in
             mailq.ApplicationHookFailure), LastFailureAtUtc.
Errors:      none.
Transaction: opens none and writes nothing.
Isolation:   the caller's (a report: a row changed meanwhile shows either way).
Lock order:  mailq.ApplicationHook, then mailq.ApplicationHookFailure (shared, brief).
Plan:        mailq.ApplicationHook is one row per hooked application; the
             failure counts group the (small) failure table once.
Example:     EXEC mailq.ListApplicationHooks;
*/
CREATE OR ALTER PROCEDURE mailq.ListApplicationHooks
    @AppName NVARCHAR(128) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

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
            EXISTS (
                SELECT 1
                FROM sys.objects AS o
                INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
                WHERE
                    o.object_id = h.ObjectId AND o.type = 'P'
                    AND s.name = h.SchemaName AND o.name = h.ProcedureName
                    AND s.principal_id = 1 AND COALESCE(o.principal_id, 1) = 1
            )
            AND HASHBYTES('SHA2_256', OBJECT_DEFINITION(h.ObjectId)) = h.DefinitionHash,
            1, 0
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
    LEFT JOIN Failures AS f ON h.AppName = f.AppName
    WHERE @AppName IS NULL OR h.AppName = @AppName
    ORDER BY h.AppName;
END;
