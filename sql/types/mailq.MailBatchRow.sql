/*
mailq.MailBatchRow: the table type of mailq.EnqueueMailBatch's @MailRows (a
table-valued parameter, for applications).  One row per mail; the columns are
mailq.EnqueueMail's parameters with the same names and types, so that a row
and a single call with the same values are the same mail (same content hash,
same validation).  RowNo is the caller's ordinal: errors and results name it.
NULL in an optional column means EnqueueMail's default.
A table type cannot be altered: a later change is a new type (or a drop and
re-create while no procedure references it), in its own revision.
Callers need EXECUTE on the type (sql/security/MailqEnqueuer.batch.grants.sql).
Revision 0015 appended RunMode (re-created by that revision's before_files
hook), revision 0016 appends TemplateName, TemplateVersion, TemplateModel
(EnqueueMail's new parameters).  A type in use cannot be altered or dropped
("Cannot drop type ... because it is being referenced"; DROP TYPE
(Transact-SQL): drop the objects that reference it first), so a type without
them (revision 0014's or 0015's) is dropped after mailq.EnqueueMailBatch, the one
module whose parameter uses it, in the migration's transaction; both are
created again by their files in this revision (the procedure's file follows
in the build order) and MailqEnqueuer.batch.grants.sql grants both again.
The downgrade rebuilds revision 0015's type the same way
(alembic/versions/0016_*.py, after_downgrade).
*/
IF TYPE_ID(N'mailq.MailBatchRow') IS NOT NULL
    AND NOT EXISTS (
        SELECT 1
        FROM sys.table_types AS t
        INNER JOIN sys.columns AS c ON t.type_table_object_id = c.[object_id]
        WHERE t.user_type_id = TYPE_ID(N'mailq.MailBatchRow') AND c.name = N'TemplateModel'
    )
BEGIN
    -- Dynamic: the schema model of tools/tsqlcheck holds both objects.
    IF OBJECT_ID(N'mailq.EnqueueMailBatch', N'P') IS NOT NULL
        EXEC sys.sp_executesql N'DROP PROCEDURE mailq.EnqueueMailBatch;';
    EXEC sys.sp_executesql N'DROP TYPE mailq.MailBatchRow;';
END;

IF TYPE_ID(N'mailq.MailBatchRow') IS NULL
    CREATE TYPE mailq.MailBatchRow AS TABLE (
        RowNo INT NOT NULL PRIMARY KEY,
        ToAddress NVARCHAR(MAX) NULL,
        Subject NVARCHAR(MAX) NULL,
        Body NVARCHAR(MAX) NULL,
        BodyFormat NVARCHAR(20) NULL,
        TextBody NVARCHAR(MAX) NULL,
        CC NVARCHAR(MAX) NULL,
        BCC NVARCHAR(MAX) NULL,
        FromAddress NVARCHAR(MAX) NULL,
        FromName NVARCHAR(MAX) NULL,
        ReplyTo NVARCHAR(MAX) NULL,
        Headers NVARCHAR(MAX) NULL,
        AccountName NVARCHAR(4000) NULL,
        AppName NVARCHAR(4000) NULL,
        Priority INT NULL,
        DateToProcess DATETIME2(3) NULL,
        ExpiresAtUtc DATETIME2(3) NULL,
        MaxAttempts INT NULL,
        IdempotencyKey NVARCHAR(4000) NULL,
        Attachments NVARCHAR(MAX) NULL,
        RunMode NVARCHAR(4000) NULL,
        TemplateName NVARCHAR(4000) NULL,
        TemplateVersion INT NULL,
        TemplateModel NVARCHAR(MAX) NULL
    );
