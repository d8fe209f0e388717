/*
mailq.MailTemplate: one row per template name: latest version, description,
retirement; versions in mailq.MailTemplateVersion.  TemplateName: 1-128 letters,
digits, '.', '_', '-' (50210).
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
