/*
mailq.ApplicationPrincipal: which application a database user enqueues as: its
mail carries that application (another @AppName: 50168) and its bindings apply.
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
