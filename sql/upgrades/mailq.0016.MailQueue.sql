/*
Revision 0016: mail enqueued with a template (issue 16, point 2, part B),
added in place to mailq.MailQueue without moving, copying or deleting a
queued mail.  Every step is guarded, so a second run changes nothing.
    TemplateName     NVARCHAR(128) NULL  the template (mailq.MailTemplate) the
                     worker renders the subject and body from; NULL: ordinary mail
    TemplateVersion  INT NULL            the version the caller pinned; NULL:
                     the latest active version when the mail is claimed
    TemplateModel    NVARCHAR(MAX) NULL  the JSON object the template renders
                     (stored out of row, like Body: 'large value types out of row')
    CK_MailQueue_Template: the three are all NULL (ordinary mail), or name and
                     model are given (model a JSON object text), version NULL or >= 1.
Body stays NOT NULL: template mail stores Body = N'' and Subject = N'' (the
worker renders both at send time), so every existing reader of Body (views,
sysmail views, the worker below 0016) keeps reading a string.
Locks: a schema-modification lock on mailq.MailQueue for the length of the
migration's transaction.  The columns are nullable without a default, so no
existing row needs a value; adding the constraint checks the existing rows
(WITH CHECK, the default for a new constraint: ALTER TABLE (Transact-SQL),
"WITH CHECK | WITH NOCHECK"), one read of each row, so it stays trusted:
every existing row has the three columns NULL.  Stop the workers during the
upgrade, as for every revision.
Every step is dynamic SQL: the schema model of tools/tsqlcheck takes the
table's shape from sql/tables/mailq.MailQueue.sql, which already holds the
columns and the constraint.
Downgrade: DOWNGRADE_0016 in alembic/versions/0016_*.py (refused with 50289
while a mail that is not finished carries a template).
*/
IF COL_LENGTH(N'mailq.MailQueue', N'TemplateName') IS NULL
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailQueue ADD TemplateName NVARCHAR(128) NULL;';

IF COL_LENGTH(N'mailq.MailQueue', N'TemplateVersion') IS NULL
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailQueue ADD TemplateVersion INT NULL;';

IF COL_LENGTH(N'mailq.MailQueue', N'TemplateModel') IS NULL
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailQueue ADD TemplateModel NVARCHAR(MAX) NULL;';

IF OBJECT_ID(N'mailq.CK_MailQueue_Template', N'C') IS NULL
    EXEC sys.sp_executesql
        N'ALTER TABLE mailq.MailQueue WITH CHECK ADD CONSTRAINT CK_MailQueue_Template CHECK (
              (TemplateName IS NULL AND TemplateVersion IS NULL AND TemplateModel IS NULL)
              OR (
                  TemplateName IS NOT NULL AND TemplateModel IS NOT NULL AND ISJSON(TemplateModel) = 1
                  AND (TemplateVersion IS NULL OR TemplateVersion >= 1)
              )
          );';
