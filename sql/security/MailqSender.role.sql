/*
Role MailqSender: sender workers: claim, extend, release and acknowledge mail, read health.
No role holds table rights (ownership chaining from dbo-owned procedures).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqSender') IS NULL
    CREATE ROLE MailqSender AUTHORIZATION dbo;
