/*
Grants of role MailqDbMailUser: send through mailq.SendDbMail and read the
Database Mail compatible views (each member sees only the mail they sent).
*/
GRANT EXECUTE ON OBJECT::mailq.SendDbMail TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_allitems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_sentitems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_unsentitems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_faileditems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_event_log TO MailqDbMailUser;
