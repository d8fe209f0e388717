/*
mailq.sysmail_configuration: msdb.dbo.sysmail_configuration's columns with this
package's fixed values (docs/database-mail.md, "Settings"): MaxFileSize,
ProhibitedExtensions (14630), AccountRetryAttempts (attempts per mail), LoggingLevel 2.
*/
CREATE OR ALTER VIEW mailq.sysmail_configuration
AS
SELECT
    c.paramname,
    c.paramvalue,
    c.description,
    CAST(NULL AS DATETIME) AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user
FROM (
    VALUES
    (
        CAST(N'AccountRetryAttempts' AS NVARCHAR(256)), CAST(N'5' AS NVARCHAR(256)),
        CAST(N'Attempts per mail (all accounts together), then the mail fails' AS NVARCHAR(256))
    ),
    (N'LoggingLevel', N'2', N'sysmail_event_log: errors, warnings, successes and information'),
    (N'MaxFileSize', N'10485760', N'Bytes per attachment (the queue''s limit)'),
    (N'ProhibitedExtensions', N'exe,dll,vbs,js', N'Refused for @query_attachment_filename (14630)')
) AS c(paramname, paramvalue, description);
