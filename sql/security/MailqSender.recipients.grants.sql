/*
Per-recipient outcomes: workers and administrators record and read them.
*/
GRANT EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.GetRecipientOutcomes TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetRecipientOutcomes TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecipientOutcomes TO MailqAdmin;
