/*
Grants of role MailqEnqueuer: enqueue mail, nothing else.  Object-level
grants (not SCHEMA::mailq) so that internal procedures such as
mailq.LockLeasedMail stay out of reach.
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqEnqueuer;
