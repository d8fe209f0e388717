/*
Role MailqDbMailRunner: the query runner of mailq.SendDbMail (mailq-db
dbmail-runner) claims waiting queries and hands back their results.  To run a
caller's query as that caller, the runner's user also needs IMPERSONATE on
each database user that sends @query mail, granted by the DBA one by one:
GRANT IMPERSONATE ON USER::[report_user] TO MailqDbMailRunner;
(docs/database-mail.md, "How @query runs": what that grant means).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqDbMailRunner') IS NULL
    CREATE ROLE MailqDbMailRunner AUTHORIZATION dbo;
