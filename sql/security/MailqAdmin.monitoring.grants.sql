/*
Grants of role MailqAdmin on the monitoring procedures: the dashboard's
actions (mailq.CancelMail, mailq.RequeueMail, mailq.UnblockSendingAccount,
granted in MailqAdmin.grants.sql) list their mails with mailq.FindMail.
*/
GRANT EXECUTE ON OBJECT::mailq.GetQueueMetrics TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailHistory TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.FindMail TO MailqAdmin;
