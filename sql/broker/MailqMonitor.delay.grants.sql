/* Monitoring: delay.GetTaskMetrics, and VIEW DEFINITION on the queue so that its
QueueReceiveEnabled is visible (catalog views show a queue only to permission holders). */
GRANT EXECUTE ON OBJECT::delay.GetTaskMetrics TO MailqMonitor;
GRANT VIEW DEFINITION ON OBJECT::dbo.DelayServiceQueue TO MailqMonitor;
