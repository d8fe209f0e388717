/*
Revision 0016: lazy attachments (issue 16, point 2, part B), added in place to
mailq.MailAttachment.  Every step is guarded, so a second run changes nothing.
    Content        becomes NULL-able (NULL: the worker generates the content)
    Generator      NVARCHAR(128) NULL  an entry point of the group
                   mailq_db.attachment_generators that the worker calls
    GeneratorArgs  NVARCHAR(MAX) NULL  its arguments, a JSON object text
    CK_MailAttachment_Source: exactly one of Content and Generator; arguments
                   only with a generator, and then JSON.
CK_MailAttachment_Size references Content, and a column used in a CHECK
constraint cannot be altered (ALTER TABLE (Transact-SQL), ALTER COLUMN: "The
modified column can't be ... used in a CHECK or UNIQUE constraint"): it is
dropped, the column altered, and it is added again unchanged (a NULL Content
passes it).  NOT NULL -> NULL changes no stored value; the two constraints
are added WITH CHECK (the default), one read of each attachment row (the
length of an out-of-row value is in its root), so both stay trusted.
Locks: a schema-modification lock on mailq.MailAttachment for the length of
the migration's transaction; stop the workers during the upgrade.
Dynamic SQL for the same reason as mailq.0016.MailQueue.sql.
Downgrade: DOWNGRADE_0016 in alembic/versions/0016_*.py (refused with 50289
while a lazy attachment exists).
*/
IF EXISTS (
    SELECT 1
    FROM sys.columns AS c
    WHERE c.[object_id] = OBJECT_ID(N'mailq.MailAttachment') AND c.name = N'Content' AND c.is_nullable = 0
)
BEGIN
    IF OBJECT_ID(N'mailq.CK_MailAttachment_Size', N'C') IS NOT NULL
        ALTER TABLE mailq.MailAttachment DROP CONSTRAINT CK_MailAttachment_Size;
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailAttachment ALTER COLUMN Content VARBINARY(MAX) NULL;';
END;

IF OBJECT_ID(N'mailq.CK_MailAttachment_Size', N'C') IS NULL
    EXEC sys.sp_executesql
        N'ALTER TABLE mailq.MailAttachment WITH CHECK ADD CONSTRAINT CK_MailAttachment_Size
          CHECK (DATALENGTH(Content) <= 10485760);';

IF COL_LENGTH(N'mailq.MailAttachment', N'Generator') IS NULL
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailAttachment ADD Generator NVARCHAR(128) NULL;';

IF COL_LENGTH(N'mailq.MailAttachment', N'GeneratorArgs') IS NULL
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailAttachment ADD GeneratorArgs NVARCHAR(MAX) NULL;';

IF OBJECT_ID(N'mailq.CK_MailAttachment_Source', N'C') IS NULL
    EXEC sys.sp_executesql
        N'ALTER TABLE mailq.MailAttachment WITH CHECK ADD CONSTRAINT CK_MailAttachment_Source CHECK (
              (Content IS NOT NULL AND Generator IS NULL AND GeneratorArgs IS NULL)
              OR (
                  Content IS NULL AND Generator IS NOT NULL AND LEN(Generator) > 0
                  AND (GeneratorArgs IS NULL OR ISJSON(GeneratorArgs) = 1)
              )
          );';
