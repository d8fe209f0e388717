/*
mailq.HookPin: the registered hook as it is now, if still the procedure that was
registered (same object_id, schema, name, owner dbo, SHA2_256 of its definition);
no row otherwise.  RunApplicationHooks reads it before and after every call: the
same ModifyDate means nothing altered the hook in between (docs/hooks.md).
Parameters:  @ObjectId INT, @SchemaName SYSNAME, @ProcedureName SYSNAME,
             @DefinitionHash VARBINARY(32): mailq.ApplicationHook's pin
Result set:  zero or one row: ModifyDate DATETIME (sys.objects.modify_date)
Security:    the catalog shows only what the caller may see: read as dbo.
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
