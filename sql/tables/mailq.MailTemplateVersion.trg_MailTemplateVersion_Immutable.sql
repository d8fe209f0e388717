/*
mailq.trg_MailTemplateVersion_Immutable: template versions never change, for
anyone with table rights too (db_owner, a hand-written fix): an UPDATE or
DELETE is refused with 50218, which rolls back the statement's transaction.
Add a version (mailq.AddMailTemplateVersion) or retire the template
(mailq.RetireMailTemplate) instead.  INSTEAD OF: the rows are never touched.
TRUNCATE and DROP TABLE do not fire it.  FK_MailTemplateVersion_MailTemplate
must keep NO ACTION (an INSTEAD OF trigger forbids cascading keys).
*/
CREATE OR ALTER TRIGGER mailq.trg_MailTemplateVersion_Immutable
ON mailq.MailTemplateVersion
INSTEAD OF UPDATE, DELETE
AS
BEGIN
    SET NOCOUNT ON;
    IF NOT EXISTS (SELECT 1 FROM deleted)
        RETURN;
    DECLARE @Msg NVARCHAR(2048) = CONCAT(
        N'mailq.MailTemplateVersion rows are immutable: add a new version with mailq.AddMailTemplateVersion, ',
        N'or retire the template with mailq.RetireMailTemplate.'
    );
    THROW 50218, @Msg, 1;
END;
