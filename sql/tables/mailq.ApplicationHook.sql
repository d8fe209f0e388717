/*
mailq.ApplicationHook: an application's hook procedure and the dispatcher's cursor
(docs/hooks.md).  SchemaName, ProcedureName, ObjectId, DefinitionHash: the pin (it
runs only while that procedure is unchanged).  CursorEventID: the last event
handled or given up.  FailingEventID, FailCount: the event failing, how often.
*/
IF OBJECT_ID(N'mailq.ApplicationHook', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationHook (
        AppName NVARCHAR(128) NOT NULL,
        SchemaName SYSNAME NOT NULL,
        ProcedureName SYSNAME NOT NULL,
        ObjectId INT NOT NULL,
        DefinitionHash VARBINARY(32) NOT NULL,
        MaxAttempts INT NOT NULL
        CONSTRAINT DF_ApplicationHook_MaxAttempts DEFAULT (3),
        CursorEventID BIGINT NOT NULL
        CONSTRAINT DF_ApplicationHook_CursorEventID DEFAULT (0),
        FailingEventID BIGINT NULL,
        FailCount INT NOT NULL
        CONSTRAINT DF_ApplicationHook_FailCount DEFAULT (0),
        LastError NVARCHAR(4000) NULL,
        LastRunAtUtc DATETIME2(3) NULL,
        RegisteredAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationHook_RegisteredAtUtc DEFAULT (SYSUTCDATETIME()),
        RegisteredBy NVARCHAR(128) NOT NULL
        CONSTRAINT DF_ApplicationHook_RegisteredBy DEFAULT (ORIGINAL_LOGIN()),
        CONSTRAINT PK_ApplicationHook PRIMARY KEY CLUSTERED (AppName),
        CONSTRAINT FK_ApplicationHook_Application FOREIGN KEY (AppName) REFERENCES mailq.Application (AppName),
        CONSTRAINT CK_ApplicationHook_MaxAttempts CHECK (MaxAttempts BETWEEN 1 AND 100),
        CONSTRAINT CK_ApplicationHook_FailCount CHECK (FailCount >= 0)
    );
END;
