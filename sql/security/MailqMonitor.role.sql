/*
Role MailqMonitor: read-only monitoring (`mailq-db exporter`, `mailq-db dashboard`);
no procedure that changes a mail or an account.
*/
IF DATABASE_PRINCIPAL_ID(N'MailqMonitor') IS NULL
    CREATE ROLE MailqMonitor AUTHORIZATION dbo;
