/*
mailq.HookPin: the registered hook as it is now, if it is still the procedure
that was registered: same object_id, schema, name, owner (dbo) and definition
(SHA2_256 of OBJECT_DEFINITION = the pinned hash).  No row otherwise.
mailq.RunApplicationHooks reads it before every call and, in the call's
transaction, again after it: the same ModifyDate both times means nothing
altered the hook in between (docs/hooks.md, "The check and the call").
Parameters:  @ObjectId INT, @SchemaName SYSNAME, @ProcedureName SYSNAME,
             @DefinitionHash VARBINARY(32): mailq.ApplicationHook's pin
Result set:  zero or one row: ModifyDate DATETIME (sys.objects.modify_date)
Security:    the catalog shows a procedure only to whoever may see it: the
             dispatcher reads it as dbo (EXECUTE AS OWNER).
Example:     SELECT ModifyDate FROM mailq.HookPin(@ObjectId, N'billing', N'OnMailEvent', @Hash);
*/
CREATE OR ALTER FUNCTION mailq.HookPin(
    @ObjectId INT,
    @SchemaName SYSNAME,
    @ProcedureName SYSNAME,
    @DefinitionHash VARBINARY(32)
)
RETURNS TABLE
AS
RETURN
SELECT ModifyDate = o.modify_date
FROM sys.objects AS o
INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
WHERE
    o.object_id = @ObjectId
    AND o.type = 'P'
    AND s.name = @SchemaName
    AND o.name = @ProcedureName
    AND s.principal_id = 1
    AND COALESCE(o.principal_id, 1) = 1
    AND HASHBYTES('SHA2_256', OBJECT_DEFINITION(o.object_id)) = @DefinitionHash;
