/*
Grants of role MailqAdmin (sql/security/MailqAdmin.role.sql) on delayed
execution: the operator views, the metrics, the monitor, the purge, cancelling
any task.  VIEW DEFINITION on the queue lets delay.Health read its status row
(catalog views show an object only to whoever has a permission on it).
Not the allow-list (delay.AllowProcedure, delay.DisallowProcedure) nor
delay.EnableThisDatabase: db_owner decisions.
*/
GRANT SELECT ON OBJECT::delay.PendingTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.FinishedTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.Health TO MailqAdmin;
GRANT VIEW DEFINITION ON OBJECT::dbo.DelayServiceQueue TO MailqAdmin;
GRANT EXECUTE ON OBJECT::delay.GetTaskMetrics TO MailqAdmin;
GRANT EXECUTE ON OBJECT::delay.Monitor TO MailqAdmin;
GRANT EXECUTE ON OBJECT::delay.PurgeHistory TO MailqAdmin;
GRANT EXECUTE ON OBJECT::dbo.CancelDelayExecution TO MailqAdmin;
