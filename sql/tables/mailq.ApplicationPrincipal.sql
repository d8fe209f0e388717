/*
mailq.ApplicationPrincipal: which application a database user enqueues as.
When the caller of mailq.EnqueueMail (USER_NAME(), or the user impersonated by
EXECUTE AS) is listed, its mail carries that application: @AppName NULL means
this one, another is refused (50168), and its account and From bindings
apply.  mailq.GetInstallationHealth warns about MailqEnqueuer members not
listed.  Written by mailq.BindApplication / UnbindApplication @PrincipalName.
*/
IF OBJECT_ID(N'mailq.ApplicationPrincipal', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationPrincipal (
        PrincipalName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationPrincipal_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_ApplicationPrincipal PRIMARY KEY CLUSTERED (PrincipalName),
        CONSTRAINT FK_ApplicationPrincipal_Application FOREIGN KEY (AppName)
        REFERENCES mailq.Application (AppName)
    );
END;
