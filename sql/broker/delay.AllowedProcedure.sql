/*
delay.AllowedProcedure: the allow-list.  An entry is a procedure, its object ID when
delay.AllowProcedure listed it and the SHA2_256 of its definition then (the pin);
listing also grants MailqRunner EXECUTE on it.  A task of an entry whose procedure
was altered, dropped, recreated or moved is Held until it is listed again; a task
of a target with no entry (never listed, or disallowed) is Refused.
AllowBareName = 1: the one-part form (N'TCXG') resolves to this entry (at most one
entry each).  MaxReaders: readers that may run it at once (NULL: MAX_QUEUE_READERS - 1,
at least 1), so a slow or blocked target never holds every reader.
*/
IF OBJECT_ID(N'delay.AllowedProcedure', N'U') IS NULL
    CREATE TABLE delay.AllowedProcedure (
        AllowedProcedureId INT IDENTITY (1, 1) NOT NULL,
        SchemaName SYSNAME NOT NULL,
        ProcedureName SYSNAME NOT NULL,
        ObjectId INT NOT NULL,
        DefinitionHash VARBINARY(32) NOT NULL,
        AllowBareName BIT NOT NULL CONSTRAINT DF_AllowedProcedure_AllowBareName DEFAULT (0),
        MaxReaders INT NULL,
        ListedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_AllowedProcedure_ListedAtUtc DEFAULT (SYSUTCDATETIME()),
        ListedBy NVARCHAR(128) NOT NULL CONSTRAINT DF_AllowedProcedure_ListedBy DEFAULT (ORIGINAL_LOGIN()),
        CONSTRAINT PK_AllowedProcedure PRIMARY KEY CLUSTERED (AllowedProcedureId),
        CONSTRAINT UQ_AllowedProcedure_SchemaName_ProcedureName UNIQUE (SchemaName, ProcedureName),
        CONSTRAINT CK_AllowedProcedure_MaxReaders CHECK (MaxReaders BETWEEN 1 AND 32767)
    );
