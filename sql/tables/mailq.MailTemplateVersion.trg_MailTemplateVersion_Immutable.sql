/*
mailq.trg_MailTemplateVersion_Immutable: refuses any UPDATE or DELETE of a template
version with 50218 (rolls back the statement's transaction), also for db_owner;
TRUNCATE and DROP do not fire it.  The foreign key must stay NO ACTION.
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
