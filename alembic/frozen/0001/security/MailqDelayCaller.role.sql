/*
Role MailqDelayCaller: may only call dbo.InitiateDelayExecution and dbo.CancelDelayExecution (grants in sql/broker/).
No role holds table rights: procedures reach the tables through ownership
chaining (every mailq object is owned by dbo).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqDelayCaller') IS NULL
    CREATE ROLE MailqDelayCaller AUTHORIZATION dbo;
