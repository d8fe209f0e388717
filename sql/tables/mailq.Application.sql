/*
mailq.Application: application names a mail may carry (TinyMail's "multiple
applications compete or are isolated").  A worker started with @AppName
claims only that application's mail (isolated); a worker with @AppName NULL
claims every mail (competing).
*/
IF OBJECT_ID(N'mailq.Application', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.Application (
        AppName NVARCHAR(128) NOT NULL,
        Description NVARCHAR(400) NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_Application_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_Application PRIMARY KEY CLUSTERED (AppName)
    );
END;
