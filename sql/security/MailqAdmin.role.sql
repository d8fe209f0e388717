/*
Role MailqAdmin: administration: every mailq procedure (requeue, cancel, purge, accounts, stats).
No role holds table rights: procedures reach the tables through ownership
chaining (every mailq object is owned by dbo).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqAdmin') IS NULL
    CREATE ROLE MailqAdmin AUTHORIZATION dbo;
