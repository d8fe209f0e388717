/*
Grants on delayed execution for monitoring: delay.GetTaskMetrics to
MailqMonitor and MailqAdmin, and VIEW DEFINITION on dbo.DelayServiceQueue so
that its QueueReceiveEnabled is visible to them (catalog views show a queue
only to principals holding a permission on it).
*/
GRANT EXECUTE ON OBJECT::delay.GetTaskMetrics TO MailqMonitor;
GRANT EXECUTE ON OBJECT::delay.GetTaskMetrics TO MailqAdmin;
GRANT VIEW DEFINITION ON OBJECT::dbo.DelayServiceQueue TO MailqMonitor;
GRANT VIEW DEFINITION ON OBJECT::dbo.DelayServiceQueue TO MailqAdmin;
