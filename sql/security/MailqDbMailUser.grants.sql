/*
Grants of role MailqDbMailUser: mailq.SendDbMail and the sysmail_* views (own mail).
*/
GRANT EXECUTE ON OBJECT::mailq.SendDbMail TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_allitems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_sentitems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_unsentitems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_faileditems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_event_log TO MailqDbMailUser;
