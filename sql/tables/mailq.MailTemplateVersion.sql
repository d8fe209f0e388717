/*
mailq.MailTemplateVersion: the versions of each template, immutable: a new
version is a new row (mailq.AddMailTemplateVersion numbers them 1, 2, 3 ...
per name), and no procedure updates or deletes a row, so a mail rendered
from (TemplateName, Version) can always be rendered again from the very
same text.  The trigger mailq.trg_MailTemplateVersion_Immutable refuses
UPDATE and DELETE (50218) from anyone, administrators included; dropping
the table (downgrade) is not a DELETE and does not fire it.
Sizes: SubjectTemplate 1-4000 characters (the rendered subject must fit
mailq.MailQueue.Subject, 900; checked when rendering), HtmlTemplate and
TextTemplate up to 2,000,000 characters each (EnqueueMail's body limit,
50111), at least one of them given.  CreatedBy is SUSER_SNAME() of the
caller (the login, not the database user, so an audit survives a user
being dropped).
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
