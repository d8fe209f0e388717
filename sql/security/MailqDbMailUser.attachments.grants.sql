/*
MailqDbMailUser on the attachments view (as msdb; own mail only); its own file:
the view is created after MailqDbMailUser.grants.sql.
*/
GRANT SELECT ON OBJECT::mailq.sysmail_mailattachments TO MailqDbMailUser;
