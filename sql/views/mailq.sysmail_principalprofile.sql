/*
mailq.sysmail_principalprofile: msdb.dbo.sysmail_principalprofile's columns over
mailq.DbMailPrincipalProfile; principal_sid 0x00 for public, NULL for a principal
gone; principal_name added last.
*/
CREATE OR ALTER VIEW mailq.sysmail_principalprofile
AS
SELECT
    pp.ProfileID AS profile_id,
    CAST(IIF(pp.PrincipalName = N'public', 0x00, dp.sid) AS VARBINARY(85)) AS principal_sid,
    pp.IsDefault AS is_default,
    CAST(NULL AS DATETIME) AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user,
    CAST(pp.PrincipalName AS SYSNAME) AS principal_name
FROM mailq.DbMailPrincipalProfile AS pp
LEFT JOIN sys.database_principals AS dp ON pp.PrincipalName = dp.name;
