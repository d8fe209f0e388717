/*
mailq.FinalizeMail: sender workers run it on a timer; administrators and
their jobs may run it too.
*/
GRANT EXECUTE ON OBJECT::mailq.FinalizeMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.FinalizeMail TO MailqAdmin;
