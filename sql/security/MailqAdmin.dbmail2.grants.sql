/*
Grants of role MailqAdmin on the Database Mail catalogue and attachments views.
*/
GRANT SELECT ON OBJECT::mailq.sysmail_mailattachments TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_profile TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_account TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_profileaccount TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_principalprofile TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_configuration TO MailqAdmin;
