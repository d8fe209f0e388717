/*
Grants of role MailqSender (sender workers): claim, extend, release and
acknowledge mail, and read the installation health for `mailq-db doctor`.
*/
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqSender;
