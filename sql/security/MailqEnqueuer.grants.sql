/*
Grants of role MailqEnqueuer: enqueue mail and read its events
(mailq.GetMailEvents, revision 0011), nothing else.  Object-level
grants (not SCHEMA::mailq) so that internal procedures such as
mailq.LockLeasedMail stay out of reach.  The enqueue role cannot claim or
acknowledge (no grant on mailq.ClaimMail, MarkSent...), cannot change its own
bindings (mailq.BindApplication is MailqAdmin's), and what it may send as is
limited per application by mailq.ApplicationAccount / mailq.ApplicationFrom
(tests/integration/test_mailq_roles.py).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqEnqueuer;
GRANT EXECUTE ON OBJECT::mailq.GetMailEvents TO MailqEnqueuer;
