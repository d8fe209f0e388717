/*
Role MailqMonitor: read-only monitoring (`mailq-db exporter`, the read-only
`mailq-db dashboard`): the queue's metrics, one mail's history and events,
the statistics.  No procedure that changes a mail or an account.
*/
IF DATABASE_PRINCIPAL_ID(N'MailqMonitor') IS NULL
    CREATE ROLE MailqMonitor AUTHORIZATION dbo;
