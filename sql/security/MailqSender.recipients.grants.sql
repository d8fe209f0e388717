/*
Per-recipient outcomes: sender workers record and read them; administrators
too, and read the report view.
*/
GRANT EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.GetRecipientOutcomes TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetRecipientOutcomes TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecipientOutcomes TO MailqAdmin;
