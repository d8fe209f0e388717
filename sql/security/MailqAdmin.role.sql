/*
Role MailqAdmin: administration: every mailq procedure (requeue, cancel, purge, accounts, stats).
No role holds table rights (ownership chaining from dbo-owned procedures).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqAdmin') IS NULL
    CREATE ROLE MailqAdmin AUTHORIZATION dbo;
