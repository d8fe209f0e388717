/*
mailq.Application: application names a mail may carry; an isolated worker claims
one application's mail.  DryRun: 1 = recorded as DryRun, reaching no server
(docs/run-modes.md).
*/
IF OBJECT_ID(N'mailq.Application', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.Application (
        AppName NVARCHAR(128) NOT NULL,
        Description NVARCHAR(400) NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_Application_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        DryRun BIT NOT NULL CONSTRAINT DF_Application_DryRun DEFAULT (0),
        CONSTRAINT PK_Application PRIMARY KEY CLUSTERED (AppName)
    );
END;
