/*
Grants of role MailqAdmin on the monitoring procedures (the dashboard's actions).
*/
GRANT EXECUTE ON OBJECT::mailq.GetQueueMetrics TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailHistory TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.FindMail TO MailqAdmin;
