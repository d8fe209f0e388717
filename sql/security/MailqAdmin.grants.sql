/*
Grants of role MailqAdmin: every public mailq procedure and the reporting views.
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RequeueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.CancelMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.PurgeMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UnblockSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.BindApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UnbindApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetQueueStats TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.QueueCountsByStatus TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.OldestDueMail TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.ThroughputPerHour TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecentFailures TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailEvents TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.StopMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.AcquireLoginSlot TO MailqAdmin;
