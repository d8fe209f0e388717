/*
Role MailqEnqueuer: enqueue mail and read its events, nothing else.
Object-level grants (not SCHEMA::mailq), so internal procedures such as
mailq.LockLeasedMail stay out of reach; no claim, acknowledgement or binding
procedure.  What it may send as is bound per application
(mailq.ApplicationAccount, ApplicationFrom; docs/dba-guide.md, section 3).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqEnqueuer;
GRANT EXECUTE ON OBJECT::mailq.GetMailEvents TO MailqEnqueuer;
