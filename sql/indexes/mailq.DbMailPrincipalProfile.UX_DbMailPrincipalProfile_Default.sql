/*
UX_DbMailPrincipalProfile_Default: at most one default profile per principal.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE
        name = N'UX_DbMailPrincipalProfile_Default'
        AND object_id = OBJECT_ID(N'mailq.DbMailPrincipalProfile')
)
BEGIN
    CREATE UNIQUE NONCLUSTERED INDEX UX_DbMailPrincipalProfile_Default
    ON mailq.DbMailPrincipalProfile (PrincipalName)
    WHERE IsDefault = 1;
END;
