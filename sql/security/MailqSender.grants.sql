/*
Role MailqSender (sender workers): claim, extend, release, acknowledge, read health;
no mailq.EnqueueMail: a worker's login cannot enqueue.
*/
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.AcquireLoginSlot TO MailqSender;
