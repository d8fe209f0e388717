/*
Role MailqDbMailUser: Database Mail callers (msdb's DatabaseMailUserRole): may
call mailq.SendDbMail and read the sysmail_* views (their own mail only).
A separate role rather than MailqEnqueuer: SendDbMail runs a caller's @query,
so who may use it is decided on its own.  The query runs with the caller's
own rights (mailq-db dbmail-runner), so membership grants no data access.
No role holds table rights: procedures reach the tables through ownership
chaining (every mailq object is owned by dbo).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqDbMailUser') IS NULL
    CREATE ROLE MailqDbMailUser AUTHORIZATION dbo;
