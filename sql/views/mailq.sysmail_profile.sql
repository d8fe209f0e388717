/*
mailq.sysmail_profile: msdb.dbo.sysmail_profile's columns over mailq.DbMailProfile
(last_mod_datetime: the creation time, local; last_mod_user NULL).
*/
CREATE OR ALTER VIEW mailq.sysmail_profile
AS
SELECT
    p.ProfileID AS profile_id,
    CAST(p.ProfileName AS SYSNAME) AS name,
    CAST(p.Description AS NVARCHAR(256)) AS description,
    CAST(DATEADD(MINUTE, DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()), p.CreatedAtUtc) AS DATETIME)
    AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user
FROM mailq.DbMailProfile AS p;
