/*
Role MailqEnqueuer: may only enqueue mail (EXECUTE mailq.EnqueueMail).
No role holds table rights: procedures reach the tables through ownership
chaining (every mailq object is owned by dbo).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqEnqueuer') IS NULL
    CREATE ROLE MailqEnqueuer AUTHORIZATION dbo;
