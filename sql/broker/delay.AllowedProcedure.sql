/*
delay.AllowedProcedure: the allow-list of procedures that delayed execution may run.
An entry is a schema-qualified procedure and the object_id it had when it was
listed (delay.AllowProcedure).  At call time and again at execution time a name
resolves only if the entry exists AND sys.objects still holds a SQL procedure
with that object_id, schema and name: a procedure dropped and recreated (even
under the same name) must be listed again.
AllowBareName = 1 lets a one-part name (the platform stores bare names such as
N'TCXG') resolve to this entry; at most one entry per bare name may allow it
(UX_AllowedProcedure_BareName).  A bare name never resolves through anybody's
default schema.
DefinitionHash pins the procedure's text: SHA2_256 of OBJECT_DEFINITION at
listing time.  ALTER PROCEDURE keeps the object_id, so without it anyone who
may alter a listed procedure could run code as dbo at its next schedule; a
changed definition resolves to 50340 until a db_owner lists it again.
*/
IF OBJECT_ID(N'delay.AllowedProcedure', N'U') IS NULL
BEGIN
    CREATE TABLE delay.AllowedProcedure (
        AllowedProcedureId INT IDENTITY (1, 1) NOT NULL,
        SchemaName SYSNAME NOT NULL,
        ProcedureName SYSNAME NOT NULL,
        ObjectId INT NOT NULL,
        AllowBareName BIT NOT NULL
            CONSTRAINT DF_AllowedProcedure_AllowBareName DEFAULT (0),
        ListedAtUtc DATETIME2(3) NOT NULL
            CONSTRAINT DF_AllowedProcedure_ListedAtUtc DEFAULT (SYSUTCDATETIME()),
        ListedBy NVARCHAR(128) NOT NULL
            CONSTRAINT DF_AllowedProcedure_ListedBy DEFAULT (ORIGINAL_LOGIN()),
        DefinitionHash VARBINARY(32) NULL,
        CONSTRAINT PK_AllowedProcedure PRIMARY KEY CLUSTERED (AllowedProcedureId),
        CONSTRAINT UQ_AllowedProcedure_SchemaName_ProcedureName UNIQUE (SchemaName, ProcedureName)
    );
END;
