/*
Role MailqDelayCaller: may only call dbo.InitiateDelayExecution and dbo.CancelDelayExecution (grants in sql/broker/).
No role holds table rights (ownership chaining from dbo-owned procedures).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqDelayCaller') IS NULL
    CREATE ROLE MailqDelayCaller AUTHORIZATION dbo;
