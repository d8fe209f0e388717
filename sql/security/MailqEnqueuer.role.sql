/*
Role MailqEnqueuer: may only enqueue mail (EXECUTE mailq.EnqueueMail).
No role holds table rights (ownership chaining from dbo-owned procedures).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqEnqueuer') IS NULL
    CREATE ROLE MailqEnqueuer AUTHORIZATION dbo;
