/*
Grants of role MailqAdmin for the Database Mail catalogue views (profiles,
accounts, grants, settings) and the attachments view.
*/
GRANT SELECT ON OBJECT::mailq.sysmail_mailattachments TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_profile TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_account TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_profileaccount TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_principalprofile TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_configuration TO MailqAdmin;
