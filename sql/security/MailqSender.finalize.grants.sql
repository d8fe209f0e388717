/*
mailq.FinalizeMail: sender workers run it on a timer; administrators may too.
*/
GRANT EXECUTE ON OBJECT::mailq.FinalizeMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.FinalizeMail TO MailqAdmin;
