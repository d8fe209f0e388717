/*
Grants of role MailqAdmin for Database Mail: send, manage profiles, read all items.
*/
GRANT EXECUTE ON OBJECT::mailq.SendDbMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertDbMailProfile TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.DeleteDbMailProfile TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertDbMailProfileAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.DeleteDbMailProfileAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertDbMailPrincipalProfile TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.DeleteDbMailPrincipalProfile TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_allitems TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_sentitems TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_unsentitems TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_faileditems TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_event_log TO MailqAdmin;
