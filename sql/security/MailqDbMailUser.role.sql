/*
Role MailqDbMailUser: Database Mail callers (msdb's DatabaseMailUserRole): may
call mailq.SendDbMail and read the sysmail_* views (their own mail only); its own
role because SendDbMail runs a caller's @query (with the caller's own rights).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqDbMailUser') IS NULL
    CREATE ROLE MailqDbMailUser AUTHORIZATION dbo;
