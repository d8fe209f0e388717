/*
mailq.trg_MailTemplateVersion_Immutable: template versions never change
(issue 16, point 2: "a new version never changes what an already-sent mail
was rendered from").  No procedure updates or deletes mailq.MailTemplateVersion;
this trigger makes the rule hold for anyone with table rights too (db_owner,
a hand-written fix): an UPDATE or DELETE is refused with 50218 and, like any
error in a trigger, rolls back the statement's transaction.  To replace a
template's text add a version (mailq.AddMailTemplateVersion); to stop a
template from being used, retire it (mailq.RetireMailTemplate).
INSTEAD OF: the statement never touches the rows, so nothing has to be undone.
TRUNCATE TABLE and DROP TABLE do not fire DML triggers (the downgrade drops
the table).  An INSTEAD OF UPDATE/DELETE trigger cannot exist on a table whose
foreign key has an ON DELETE/ON UPDATE action: FK_MailTemplateVersion_MailTemplate
must keep NO ACTION.
Reference: https://learn.microsoft.com/en-us/sql/t-sql/statements/create-trigger-transact-sql
           https://learn.microsoft.com/en-us/previous-versions/sql/sql-server-2008/ms187834(v=sql.100)
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
