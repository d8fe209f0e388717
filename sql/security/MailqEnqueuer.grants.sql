/*
Role MailqEnqueuer: enqueue mail and read its events, nothing else; object-level
grants so internal procedures stay out of reach (docs/dba-guide.md, section 3).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqEnqueuer;
GRANT EXECUTE ON OBJECT::mailq.GetMailEvents TO MailqEnqueuer;
