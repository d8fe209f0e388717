/*
delay.AllowProcedure: puts a procedure on the allow-list of delayed execution,
or refreshes its entry (after the procedure was dropped and recreated).
Parameters:  @ProcedureName NVARCHAR(4000), required: schema-qualified,
                 N'dbo.TCXG' or N'[dbo].[TCXG]'; an existing SQL procedure of
                 this database that takes the target contract's parameters
                 @SPName, @Param1, @Param2, @Param3, @Param4, @Param5
             @AllowBareName BIT = 0: 1 lets the bare name (N'TCXG', as the
                 platform stores it) resolve to this procedure; at most one
                 listed procedure per bare name
Result set:  one row: AllowedProcedureId INT, SchemaName SYSNAME,
             ProcedureName SYSNAME, ObjectId INT, AllowBareName BIT
Errors:      50310 @ProcedureName is not a two-part name of an existing SQL
                   procedure of this database
             50311 @ProcedureName is a system procedure (sys or
                   INFORMATION_SCHEMA schema, or shipped with SQL Server)
             50312 the procedure lacks a parameter of the target contract
             50313 @AllowBareName = 1, but another listed procedure already
                   answers to that bare name
Transaction: joins the caller's via a savepoint, else opens its own.
Security:    for db_owner only (no role is granted EXECUTE): a listed procedure
             runs as dbo, so listing one is a dbo-level decision.
Example:     EXEC delay.AllowProcedure @ProcedureName = N'dbo.TCXG', @AllowBareName = 1;
*/
CREATE OR ALTER PROCEDURE delay.AllowProcedure
    @ProcedureName NVARCHAR(4000),
    @AllowBareName BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE
        @Msg NVARCHAR(2048),
        @Part1 SYSNAME,
        @Part2 SYSNAME,
        @SchemaName SYSNAME,
        @Name SYSNAME,
        @ObjectId INT,
        @IsShipped BIT,
        @Missing NVARCHAR(200);

    -- 1. Validate parameters before any transaction starts.
    SET @AllowBareName = ISNULL(@AllowBareName, 0);

    -- PARSENAME takes a sysname: refuse what it would cut.
    IF DATALENGTH(@ProcedureName) BETWEEN 2 AND 256
        AND PARSENAME(@ProcedureName, 3) IS NULL
        AND PARSENAME(@ProcedureName, 4) IS NULL
        SELECT
            @Part1 = PARSENAME(@ProcedureName, 1),
            @Part2 = PARSENAME(@ProcedureName, 2);

    IF @Part2 IN (N'sys', N'INFORMATION_SCHEMA')
    BEGIN
        SET @Msg = CONCAT(N'@ProcedureName must not be a system procedure; got ', @ProcedureName, N'.');
        THROW 50311, @Msg, 1;
    END;

    SELECT
        @ObjectId = o.object_id,
        @SchemaName = s.name,
        @Name = o.name,
        @IsShipped = o.is_ms_shipped
    FROM sys.objects AS o
    INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
    WHERE
        s.name = @Part2
        AND o.name = @Part1
        AND o.type = 'P';

    IF @ObjectId IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@ProcedureName must be schema.procedure naming an existing SQL procedure of this database; got ',
            ISNULL(LEFT(@ProcedureName, 300), N'NULL'), N'.'
        );
        THROW 50310, @Msg, 1;
    END;

    IF @IsShipped = 1
    BEGIN
        SET @Msg = CONCAT(N'@ProcedureName must not be a system procedure; got ', @ProcedureName, N'.');
        THROW 50311, @Msg, 1;
    END;

    SELECT @Missing = STRING_AGG(c.ParameterName, N', ') WITHIN GROUP (ORDER BY c.ParameterName)
    FROM (
        VALUES (N'@SPName'), (N'@Param1'), (N'@Param2'), (N'@Param3'), (N'@Param4'), (N'@Param5')
    ) AS c(ParameterName)
    WHERE NOT EXISTS (
        SELECT 1 FROM sys.parameters AS p
        WHERE p.object_id = @ObjectId AND p.name = c.ParameterName
    );

    IF @Missing IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@ProcedureName ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
            N' must take the target contract''s parameters; it lacks ', @Missing, N'.'
        );
        THROW 50312, @Msg, 1;
    END;

    -- 2. Own the transaction, or nest in the caller's with a savepoint.
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0
            BEGIN TRANSACTION;
        ELSE
            SAVE TRANSACTION AllowProcedure;

        -- UPDLOCK, HOLDLOCK: the range lock keeps two sessions from both
        -- seeing the bare name free (insert-if-absent).
        IF @AllowBareName = 1 AND EXISTS (
            SELECT 1
            FROM delay.AllowedProcedure AS ap WITH (UPDLOCK, HOLDLOCK)
            WHERE
                ap.ProcedureName = @Name
                AND ap.AllowBareName = 1
                AND ap.SchemaName <> @SchemaName
        )
        BEGIN
            SET @Msg = CONCAT(
                N'@AllowBareName = 1, but the bare name ', @Name,
                N' already resolves to another schema''s procedure; disallow that entry first.'
            );
            THROW 50313, @Msg, 1;
        END;

        -- UPDLOCK, HOLDLOCK: update-else-insert without a race between the two.
        UPDATE ap
        SET
            ObjectId = @ObjectId,
            AllowBareName = @AllowBareName,
            ListedAtUtc = SYSUTCDATETIME(),
            ListedBy = ORIGINAL_LOGIN()
        FROM delay.AllowedProcedure AS ap WITH (UPDLOCK, HOLDLOCK)
        WHERE ap.SchemaName = @SchemaName AND ap.ProcedureName = @Name;

        IF @@ROWCOUNT = 0
            INSERT INTO delay.AllowedProcedure (SchemaName, ProcedureName, ObjectId, AllowBareName)
            VALUES (@SchemaName, @Name, @ObjectId, @AllowBareName);

        IF @TranCount = 0
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION AllowProcedure;   -- undo only our work
        THROW;
    END CATCH;

    SELECT
        ap.AllowedProcedureId,
        ap.SchemaName,
        ap.ProcedureName,
        ap.ObjectId,
        ap.AllowBareName
    FROM delay.AllowedProcedure AS ap
    WHERE ap.SchemaName = @SchemaName AND ap.ProcedureName = @Name;
END;
