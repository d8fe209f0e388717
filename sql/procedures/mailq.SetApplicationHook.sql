/*
mailq.SetApplicationHook: registers, re-pins or removes one application's hook
(docs/hooks.md) and grants MailqRunner EXECUTE on it (revoking the replaced one's).
db_owner only.  The hook: a two-part SQL procedure in a dbo-owned schema, readable
definition (pinned: object_id and SHA2_256), with exactly these parameters:
  @EventID BIGINT, @MailID BIGINT, @AppName NVARCHAR(128), @EventType NVARCHAR(32),
  @Status NVARCHAR(16), @SmtpCode INT, @Detail NVARCHAR(4000), @StopMail BIT OUTPUT,
  @StopReason NVARCHAR(4000) OUTPUT
Parameters:  @AppName NVARCHAR(128); @HookProcedure NVARCHAR(300) (NULL = remove);
             @MaxAttempts INT = 3 (1-100); @ResetCursorTo BIGINT = NULL (else a new
             hook starts at the end of the stream, a re-registration keeps its cursor)
Result set:  one row: AppName, HookProcedure (NULL if removed), ObjectId,
             CursorEventID, MaxAttempts, Changed BIT
Errors:      50290 @AppName not registered; 50291 not a two-part SQL procedure, or a
             system one; 50292 schema not owned by dbo, or another owner; 50293
             parameters differ; 50294 definition unreadable; 50295 @MaxAttempts or
             @ResetCursorTo out of range
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED (UPDLOCK, HOLDLOCK update-else-insert).
Lock order:  mailq.ApplicationHook only.
Example:     EXEC mailq.SetApplicationHook @AppName = N'billing', @HookProcedure = N'billing.OnMailEvent';
*/
CREATE OR ALTER PROCEDURE mailq.SetApplicationHook
    @AppName NVARCHAR(128),
    @HookProcedure NVARCHAR(300),
    @MaxAttempts INT = 3,
    @ResetCursorTo BIGINT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE
        @Msg NVARCHAR(2048),
        @Part1 SYSNAME,
        @Part2 SYSNAME,
        @SchemaName SYSNAME,
        @Name SYSNAME,
        @ObjectId INT,
        @IsShipped BIT,
        @SchemaOwner INT,
        @ObjectOwner INT,
        @Problems NVARCHAR(2000),
        @DefinitionHash VARBINARY(32),
        @Changed BIT = 1,
        @OldObjectId INT,
        @Grant NVARCHAR(600);
    IF @AppName IS NULL OR NOT EXISTS (SELECT 1 FROM mailq.Application AS a WHERE a.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(
            N'@AppName must name a registered application (mailq.UpsertApplication); got ',
            COALESCE(N'''' + @AppName + N'''', N'NULL'), N'.'
        );
        THROW 50290, @Msg, 1;
    END;
    SET @MaxAttempts = COALESCE(@MaxAttempts, 3);
    IF @MaxAttempts NOT BETWEEN 1 AND 100 OR @ResetCursorTo < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@MaxAttempts must be 1-100 and @ResetCursorTo 0 or more; got ', @MaxAttempts, N' and ',
            COALESCE(CAST(@ResetCursorTo AS NVARCHAR(24)), N'NULL'), N'.'
        );
        THROW 50295, @Msg, 1;
    END;
    IF @HookProcedure IS NOT NULL
    BEGIN
        -- PARSENAME takes a sysname: refuse what it would cut.
        IF DATALENGTH(@HookProcedure) BETWEEN 2 AND 256
            AND PARSENAME(@HookProcedure, 3) IS NULL
            AND PARSENAME(@HookProcedure, 4) IS NULL
            SELECT
                @Part1 = PARSENAME(@HookProcedure, 1),
                @Part2 = PARSENAME(@HookProcedure, 2);
        SELECT
            @ObjectId = o.object_id,
            @SchemaName = s.name,
            @Name = o.name,
            @IsShipped = o.is_ms_shipped,
            @SchemaOwner = s.principal_id,
            @ObjectOwner = o.principal_id
        FROM sys.objects AS o
        INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
        WHERE
            s.name = @Part2
            AND o.name = @Part1
            AND o.type = 'P';
        IF @ObjectId IS NULL OR @IsShipped = 1 OR @SchemaName IN (N'sys', N'INFORMATION_SCHEMA')
        BEGIN
            SET @Msg = CONCAT(
                N'@HookProcedure must be schema.procedure naming an existing SQL procedure of this database ',
                N'(not a system procedure); got ', LEFT(@HookProcedure, 300), N'.'
            );
            THROW 50291, @Msg, 1;
        END;
        -- principal_id: the owner when it differs from the schema's, else NULL (dbo: 1).
        IF @SchemaOwner <> 1 OR COALESCE(@ObjectOwner, 1) <> 1
        BEGIN
            SET @Msg = CONCAT(
                N'@HookProcedure ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
                N' must be in a schema owned by dbo and have no other owner; schema owner ',
                QUOTENAME(USER_NAME(@SchemaOwner)), N', object owner ',
                COALESCE(QUOTENAME(USER_NAME(@ObjectOwner)), N'(the schema''s)'), N'.'
            );
            THROW 50292, @Msg, 1;
        END;
        -- Missing or different first, then extra; lengths in bytes (NVARCHAR(n): 2n).
        SELECT @Problems = STRING_AGG(x.Problem, N'; ') WITHIN GROUP (ORDER BY x.Ord)
        FROM (
            SELECT
                e.Ord,
                CONCAT(
                    e.ParameterName, N' ', e.Declared,
                    IIF(p.parameter_id IS NULL, N' is missing', N' is declared differently')
                ) AS Problem
            FROM (
                VALUES
                    (1, N'@EventID', N'bigint', 8, 0, N'BIGINT'),
                    (2, N'@MailID', N'bigint', 8, 0, N'BIGINT'),
                    (3, N'@AppName', N'nvarchar', 256, 0, N'NVARCHAR(128)'),
                    (4, N'@EventType', N'nvarchar', 64, 0, N'NVARCHAR(32)'),
                    (5, N'@Status', N'nvarchar', 32, 0, N'NVARCHAR(16)'),
                    (6, N'@SmtpCode', N'int', 4, 0, N'INT'),
                    (7, N'@Detail', N'nvarchar', 8000, 0, N'NVARCHAR(4000)'),
                    (8, N'@StopMail', N'bit', 1, 1, N'BIT OUTPUT'),
                    (9, N'@StopReason', N'nvarchar', 8000, 1, N'NVARCHAR(4000) OUTPUT')
            ) AS e(Ord, ParameterName, TypeName, MaxLength, IsOutput, Declared)
            LEFT JOIN sys.parameters AS p
                ON e.ParameterName = p.name AND p.object_id = @ObjectId
            WHERE
                p.parameter_id IS NULL
                OR TYPE_NAME(p.user_type_id) <> e.TypeName
                OR p.max_length <> e.MaxLength
                OR p.is_output <> e.IsOutput
            UNION ALL
            SELECT 100 + p.parameter_id, CONCAT(p.name, N' is not a hook parameter')
            FROM sys.parameters AS p
            WHERE
                p.object_id = @ObjectId
                AND p.name NOT IN (
                    N'@EventID', N'@MailID', N'@AppName', N'@EventType', N'@Status', N'@SmtpCode',
                    N'@Detail', N'@StopMail', N'@StopReason'
                )
        ) AS x;
        IF @Problems IS NOT NULL
        BEGIN
            SET @Msg = CONCAT(
                N'@HookProcedure ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
                N' must take exactly the hook parameters (docs/hooks.md): ', LEFT(@Problems, 1500), N'.'
            );
            THROW 50293, @Msg, 1;
        END;
        SET @DefinitionHash = HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId));
        IF @DefinitionHash IS NULL
        BEGIN
            SET @Msg = CONCAT(
                N'@HookProcedure ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
                N' has no readable definition (WITH ENCRYPTION?), so it cannot be pinned.'
            );
            THROW 50294, @Msg, 1;
        END;
    END;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        SELECT @OldObjectId = h.ObjectId
        FROM mailq.ApplicationHook AS h WITH (UPDLOCK, HOLDLOCK)
        WHERE h.AppName = @AppName;
        IF @HookProcedure IS NULL
        BEGIN
            DELETE h
            FROM mailq.ApplicationHook AS h WITH (UPDLOCK, HOLDLOCK)
            WHERE h.AppName = @AppName;
            SET @Changed = IIF(@@ROWCOUNT = 0, 0, 1);
        END;
        ELSE
        BEGIN
            -- UPDLOCK, HOLDLOCK: update-else-insert without a race between the two.
            UPDATE h
            SET
                h.SchemaName = @SchemaName,
                h.ProcedureName = @Name,
                h.ObjectId = @ObjectId,
                h.DefinitionHash = @DefinitionHash,
                h.MaxAttempts = @MaxAttempts,
                h.CursorEventID = COALESCE(@ResetCursorTo, h.CursorEventID),
                h.FailingEventID = IIF(@ResetCursorTo IS NULL, h.FailingEventID, NULL),
                h.FailCount = IIF(@ResetCursorTo IS NULL, h.FailCount, 0),
                h.LastError = NULL,
                h.RegisteredAtUtc = SYSUTCDATETIME(),
                h.RegisteredBy = ORIGINAL_LOGIN()
            FROM mailq.ApplicationHook AS h WITH (UPDLOCK, HOLDLOCK)
            WHERE h.AppName = @AppName;
            -- A new hook starts at the end of the stream (see mailq.GetMailEvents).
            IF @@ROWCOUNT = 0
                INSERT INTO mailq.ApplicationHook (
                    AppName, SchemaName, ProcedureName, ObjectId, DefinitionHash, MaxAttempts, CursorEventID
                )
                VALUES (
                    @AppName, @SchemaName, @Name, @ObjectId, @DefinitionHash, @MaxAttempts,
                    COALESCE(@ResetCursorTo, CAST(MIN_ACTIVE_ROWVERSION() AS BIGINT) - 1)
                );
        END;
        -- MailqRunner may execute exactly the registered hooks (names QUOTENAMEd).
        IF @OldObjectId IS NOT NULL AND @OldObjectId <> ISNULL(@ObjectId, 0)
            AND NOT EXISTS (SELECT 1 FROM mailq.ApplicationHook AS h WHERE h.ObjectId = @OldObjectId)
            AND OBJECT_NAME(@OldObjectId) IS NOT NULL
        BEGIN
            SET @Grant = CONCAT(
                N'REVOKE EXECUTE ON OBJECT::', QUOTENAME(OBJECT_SCHEMA_NAME(@OldObjectId)), N'.',
                QUOTENAME(OBJECT_NAME(@OldObjectId)), N' FROM MailqRunner;'
            );
            EXEC sys.sp_executesql @Grant;
        END;
        IF @HookProcedure IS NOT NULL
        BEGIN
            SET @Grant = CONCAT(
                N'GRANT EXECUTE ON OBJECT::', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name), N' TO MailqRunner;'
            );
            EXEC sys.sp_executesql @Grant;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    -- One row whether or not a hook remains (a removal returns NULLs).
    DECLARE
        @ResultProcedure NVARCHAR(300),
        @ResultObjectId INT,
        @ResultCursor BIGINT,
        @ResultMaxAttempts INT;
    SELECT
        @ResultProcedure = CONCAT(QUOTENAME(h.SchemaName), N'.', QUOTENAME(h.ProcedureName)),
        @ResultObjectId = h.ObjectId,
        @ResultCursor = h.CursorEventID,
        @ResultMaxAttempts = h.MaxAttempts
    FROM mailq.ApplicationHook AS h
    WHERE h.AppName = @AppName;
    SELECT
        @AppName AS AppName,
        @ResultProcedure AS HookProcedure,
        @ResultObjectId AS ObjectId,
        @ResultCursor AS CursorEventID,
        @ResultMaxAttempts AS MaxAttempts,
        @Changed AS Changed;
END;
