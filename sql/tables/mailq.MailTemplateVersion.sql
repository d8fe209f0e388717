/*
mailq.MailTemplateVersion: the immutable versions of each template (1, 2, 3 ...;
trg_MailTemplateVersion_Immutable refuses changes, 50218): a pinned mail renders
the same text again.  CreatedBy: SUSER_SNAME() (survives a dropped user).
*/
IF OBJECT_ID(N'mailq.MailTemplateVersion', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailTemplateVersion (
        TemplateName NVARCHAR(128) NOT NULL,
        Version INT NOT NULL,
        SubjectTemplate NVARCHAR(4000) NOT NULL,
        HtmlTemplate NVARCHAR(MAX) NULL,
        TextTemplate NVARCHAR(MAX) NULL,
        CreatedBy NVARCHAR(128) NOT NULL
        CONSTRAINT DF_MailTemplateVersion_CreatedBy DEFAULT (SUSER_SNAME()),
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_MailTemplateVersion_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_MailTemplateVersion PRIMARY KEY CLUSTERED (TemplateName, Version),
        CONSTRAINT FK_MailTemplateVersion_MailTemplate FOREIGN KEY (TemplateName)
        REFERENCES mailq.MailTemplate (TemplateName),
        CONSTRAINT CK_MailTemplateVersion_Version CHECK (Version >= 1),
        CONSTRAINT CK_MailTemplateVersion_Body CHECK (HtmlTemplate IS NOT NULL OR TextTemplate IS NOT NULL),
        CONSTRAINT CK_MailTemplateVersion_Size CHECK (
            LEN(SubjectTemplate) >= 1
            AND (HtmlTemplate IS NULL OR LEN(HtmlTemplate) <= 2000000)
            AND (TextTemplate IS NULL OR LEN(TextTemplate) <= 2000000)
        )
    );
END;
