/*
Grants of role MailqDelayCaller (created in sql/security/MailqDelayCaller.role.sql):
EXECUTE on dbo.InitiateDelayExecution and dbo.CancelDelayExecution, nothing
else.  No table, queue or service rights: both procedures run EXECUTE AS OWNER
and reach the tables and the broker as dbo.
*/
GRANT EXECUTE ON OBJECT::dbo.InitiateDelayExecution TO MailqDelayCaller;
GRANT EXECUTE ON OBJECT::dbo.CancelDelayExecution TO MailqDelayCaller;
