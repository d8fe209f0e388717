/*
mailq.GetEnqueuePolicy: the enqueue policy in force and the database users who may enqueue
without being mapped to an application (for `mailq-db doctor`); runs with the caller's rights.
Parameters:  none.
Result sets: 1. AllowUnmappedEnqueuers, ChangedAtUtc, ChangedBy, MembershipVisible BIT (0: the
                caller cannot see others' memberships: set 2 is incomplete)
             2. unmapped users, one row per way in: PrincipalName, Via (the grant's holder); Windows
                groups are listed; a DENY is not subtracted.
Errors:      none of its own.  Transaction: reads only.  Isolation: READ COMMITTED, set here.
Lock order:  none (catalog views and mailq.EnqueuePolicy, no locking hint).
Example:     EXEC mailq.GetEnqueuePolicy;
*/
CREATE OR ALTER PROCEDURE mailq.GetEnqueuePolicy
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SELECT
        COALESCE(p.AllowUnmappedEnqueuers, CAST(0 AS BIT)) AS AllowUnmappedEnqueuers,
        p.ChangedAtUtc,
        p.ChangedBy,
        CAST(IIF(
            COALESCE(IS_ROLEMEMBER(N'db_owner'), 0) = 1 OR COALESCE(IS_ROLEMEMBER(N'db_securityadmin'), 0) = 1
            OR HAS_PERMS_BY_NAME(DB_NAME(), N'DATABASE', N'VIEW DEFINITION') = 1, 1, 0
        ) AS BIT) AS MembershipVisible
    FROM (VALUES (1)) AS one(PolicyId)
    LEFT JOIN mailq.EnqueuePolicy AS p ON one.PolicyId = p.PolicyId;
    WITH grantee AS (
        SELECT d.grantee_principal_id AS PrincipalId
        FROM sys.database_permissions AS d
        WHERE
            d.permission_name = N'EXECUTE' AND d.state IN ('G', 'W')
            AND (
                d.class = 0
                OR (d.class = 3 AND d.major_id = SCHEMA_ID(N'mailq'))
                OR (d.class = 1 AND d.major_id IN (
                    OBJECT_ID(N'mailq.EnqueueMail'), OBJECT_ID(N'mailq.EnqueueMailBatch'),
                    OBJECT_ID(N'mailq.SendDbMail')
                ))
            )
        UNION ALL
        SELECT DATABASE_PRINCIPAL_ID(N'db_owner')
        UNION ALL
        SELECT DATABASE_PRINCIPAL_ID(N'dbo')
    ),

holder AS (
        SELECT g.PrincipalId, g.PrincipalId AS ViaId FROM grantee AS g
        UNION ALL
        SELECT m.member_principal_id, h.ViaId
        FROM holder AS h
        INNER JOIN sys.database_role_members AS m ON h.PrincipalId = m.role_principal_id
    )

    SELECT DISTINCT u.name AS PrincipalName, USER_NAME(h.ViaId) AS Via
    FROM holder AS h
    INNER JOIN sys.database_principals AS u ON h.PrincipalId = u.principal_id OR h.PrincipalId = 0
    WHERE
        -- users, not roles (EnqueueMail compares USER_NAME()); G: a Windows group
        u.type IN ('S', 'U', 'G', 'E', 'X', 'C', 'K')
        AND u.principal_id NOT IN (2, 3, 4)         -- guest, INFORMATION_SCHEMA, sys; dbo is listed
        AND u.name NOT IN (SELECT a.PrincipalName FROM mailq.ApplicationPrincipal AS a)
    ORDER BY u.name, USER_NAME(h.ViaId);
END;
