/*
mailq.MailAttachment: attachments of a mail, in order: Content, or a Generator
(mailq_db.attachment_generators) with GeneratorArgs, never both (docs/templates.md).
LOCK_ESCALATION = DISABLE (docs/dba-guide.md, section 7).
*/
IF OBJECT_ID(N'mailq.MailAttachment', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailAttachment (
        MailID BIGINT NOT NULL,
        AttachmentNo INT NOT NULL,
        FileName NVARCHAR(255) NOT NULL,
        ContentType NVARCHAR(255) NOT NULL
        CONSTRAINT DF_MailAttachment_ContentType DEFAULT (N'application/octet-stream'),
        Content VARBINARY(MAX) NULL,
        Generator NVARCHAR(128) NULL,
        GeneratorArgs NVARCHAR(MAX) NULL,
        CONSTRAINT PK_MailAttachment PRIMARY KEY CLUSTERED (MailID, AttachmentNo),
        CONSTRAINT FK_MailAttachment_MailQueue FOREIGN KEY (MailID)
        REFERENCES mailq.MailQueue (ID),
        CONSTRAINT CK_MailAttachment_Size CHECK (DATALENGTH(Content) <= 10485760),
        CONSTRAINT CK_MailAttachment_No CHECK (AttachmentNo BETWEEN 1 AND 10),
        CONSTRAINT CK_MailAttachment_FileName CHECK (
            LEN(FileName) > 0 AND FileName NOT LIKE N'%[/\:]%'
        ),
        CONSTRAINT CK_MailAttachment_Source CHECK (
            (Content IS NOT NULL AND Generator IS NULL AND GeneratorArgs IS NULL)
            OR (
                Content IS NULL AND Generator IS NOT NULL AND LEN(Generator) > 0
                AND (GeneratorArgs IS NULL OR ISJSON(GeneratorArgs) = 1)
            )
        )
    );
    -- Dynamic SQL: sqlfluff's tsql dialect does not parse SET (LOCK_ESCALATION = ...).
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailAttachment SET (LOCK_ESCALATION = DISABLE);';
END;
