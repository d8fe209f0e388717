/*
mailq.ApplicationPrincipal: which application a database user enqueues as
(issue 10, point 10).  When the caller of mailq.EnqueueMail (USER_NAME(),
the database user of the session, or the user impersonated by EXECUTE AS)
is listed here, its mail always carries that application: @AppName NULL
means this application, another @AppName is refused (50168), and the
application's account and From bindings then apply.  A user not listed here
enqueues as before (compatibility with applications deployed before
revision 0007); mailq.GetInstallationHealth warns about MailqEnqueuer members
that are not listed.  Rows are written by mailq.BindApplication
@PrincipalName and mailq.UnbindApplication @PrincipalName.
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
