/*
Grant of role MailqDbMailUser on the attachments view, as msdb grants
DatabaseMailUserRole sysmail_mailattachments (each member sees only the
attachments of the mail they sent).  Its own file: the view is created after
MailqDbMailUser.grants.sql runs.
*/
GRANT SELECT ON OBJECT::mailq.sysmail_mailattachments TO MailqDbMailUser;
