/*
mailq.sysmail_account: msdb.dbo.sysmail_account's columns over the sending accounts
in a profile: email_address and display_name are the account's defaults;
description and replyto_address NULL.  SMTP settings live in the worker's config.
*/
CREATE OR ALTER VIEW mailq.sysmail_account
AS
SELECT
    da.AccountID AS account_id,
    CAST(a.AccountName AS SYSNAME) AS name,
    CAST(NULL AS NVARCHAR(256)) AS description,
    a.DefaultFromAddress AS email_address,
    a.DefaultFromName AS display_name,
    CAST(NULL AS NVARCHAR(128)) AS replyto_address,
    CAST(DATEADD(MINUTE, DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()), a.CreatedAtUtc) AS DATETIME)
    AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user
FROM mailq.DbMailAccount AS da
INNER JOIN mailq.SendingAccount AS a ON da.AccountName = a.AccountName;
