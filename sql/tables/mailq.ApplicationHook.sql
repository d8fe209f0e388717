/*
mailq.ApplicationHook: the per-application hook procedure (issue 16, point 1;
TinyMail 8C.7; docs/hooks.md) and the dispatcher's cursor in that
application's event stream.  Written by mailq.SetApplicationHook (db_owner)
and by mailq.RunApplicationHooks (the cursor and the retry state).

SchemaName, ProcedureName, ObjectId  the hook, as registered: it runs only
              while sys.objects still holds a SQL procedure with that
              object_id, schema and name (a procedure dropped and recreated
              must be registered again).
DefinitionHash  SHA2_256 of OBJECT_DEFINITION at registration (the pin, as
              delay.AllowedProcedure's): ALTER PROCEDURE keeps the object_id,
              so without it anyone who may alter the hook could run code as
              dbo; a changed definition suspends the hook (no event is passed,
              the cursor stays) until a db_owner registers it again.
CursorEventID the last EventID (mailq.GetMailEvents' commit-safe cursor) the
              hook has handled or given up on; advanced in the same
              transaction as the hook's successful call.
FailingEventID, FailCount  the event the hook failed on and how many times
              in a row (reset when the cursor moves).
MaxAttempts   calls of a failing event before it is recorded in
              mailq.ApplicationHookFailure and skipped (1-100, default 3).
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
