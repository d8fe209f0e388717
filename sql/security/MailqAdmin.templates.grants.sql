/*
Mail templates: administrators manage and read them; workers read them.
*/
GRANT EXECUTE ON OBJECT::mailq.AddMailTemplateVersion TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailTemplate TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ListMailTemplates TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ListMailTemplateVersions TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RetireMailTemplate TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailTemplate TO MailqSender;
