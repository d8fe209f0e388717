/*
mailq.MailTemplate: one row per template name (issue 16, point 2): the
mutable facts about the name -- its latest version, description, whether it
is retired.  The versions themselves live in mailq.MailTemplateVersion and
never change.  Managed only through mailq.AddMailTemplateVersion and
mailq.RetireMailTemplate; read through mailq.GetMailTemplate and
mailq.ListMailTemplates.  TemplateName: 1-128 characters of letters, digits,
'.', '_', '-' (checked by the procedures, 50210), compared under the
database collation like every other name of this package.
*/
IF OBJECT_ID(N'mailq.MailTemplate', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailTemplate (
        TemplateName NVARCHAR(128) NOT NULL,
        LatestVersion INT NOT NULL,
        Description NVARCHAR(400) NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_MailTemplate_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        RetiredAtUtc DATETIME2(3) NULL,
        RetiredBy NVARCHAR(128) NULL,
        RetiredReason NVARCHAR(400) NULL,
        CONSTRAINT PK_MailTemplate PRIMARY KEY CLUSTERED (TemplateName),
        CONSTRAINT CK_MailTemplate_LatestVersion CHECK (LatestVersion >= 1)
    );
END;
