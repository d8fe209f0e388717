/*
Grants on mailq.FinalizeMail (revision 0005): sender workers run it on a
timer, administrators and their jobs (SQL Agent, elastic jobs) may run it
too.  A file of its own so that the role grant files stay as they were.
*/
GRANT EXECUTE ON OBJECT::mailq.FinalizeMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.FinalizeMail TO MailqAdmin;
