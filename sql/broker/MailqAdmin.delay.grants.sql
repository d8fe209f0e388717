/*
Grants of role MailqAdmin (created in sql/security/MailqAdmin.role.sql) on
delayed execution: reading the operator views, cancelling any task, and
reconciling (delay.Reconcile: re-arms tasks whose conversation is gone).
Not the allow-list procedures (delay.AllowProcedure, delay.DisallowProcedure):
a listed procedure runs as dbo, so listing stays with db_owner.
delay.Health also needs VIEW SERVER STATE for its ActiveReaders column, a
server permission that a database role cannot carry.
*/
GRANT SELECT ON OBJECT::delay.PendingTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.RunningTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.FailedTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.RefusedTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.Health TO MailqAdmin;
GRANT EXECUTE ON OBJECT::dbo.CancelDelayExecution TO MailqAdmin;
GRANT EXECUTE ON OBJECT::delay.Reconcile TO MailqAdmin;
