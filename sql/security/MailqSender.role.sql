/*
Role MailqSender: sender workers: claim, extend, release and acknowledge mail, read health.
No role holds table rights: procedures reach the tables through ownership
chaining (every mailq object is owned by dbo).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqSender') IS NULL
    CREATE ROLE MailqSender AUTHORIZATION dbo;
