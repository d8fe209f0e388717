/*
Grants of role MailqMonitor: reads only (docs/monitoring/README.md).
*/
GRANT EXECUTE ON OBJECT::mailq.GetQueueMetrics TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.GetMailHistory TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.FindMail TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.GetMailEvents TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.GetQueueStats TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.GetSuppressionStats TO MailqMonitor;
