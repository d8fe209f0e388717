/*
Role MailqDbMailRunner: the query runner of mailq.SendDbMail (mailq-db
dbmail-runner).  It also needs IMPERSONATE on each user that sends @query mail,
granted one by one (docs/database-mail.md, "How @query runs"):
GRANT IMPERSONATE ON USER::[report_user] TO MailqDbMailRunner;
*/
IF DATABASE_PRINCIPAL_ID(N'MailqDbMailRunner') IS NULL
    CREATE ROLE MailqDbMailRunner AUTHORIZATION dbo;
