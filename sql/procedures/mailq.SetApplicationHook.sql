/*
mailq.SetApplicationHook: registers, re-registers (re-pins) or removes the
hook procedure of one application (docs/hooks.md).  The hook is called by
mailq.RunApplicationHooks once per event of the application, in its own
transaction, as the dispatcher's owner (dbo): registering one is a
dbo-level decision, so this procedure is for db_owner only (no role is
granted EXECUTE), like delay.AllowProcedure.
The hook must:
  - be an existing SQL procedure (type P) of this database, named with two
    parts (N'billing.OnMailEvent', brackets allowed);
  - live in a schema owned by dbo and have no other owner (sys.schemas
    .principal_id = 1 and sys.objects.principal_id NULL or 1): a schema owned
    by somebody else lets that principal replace the procedure's code;
    the pin below catches an ALTER, the ownership rule keeps the decision
    with dbo in the first place;
  - not be a system procedure (sys, INFORMATION_SCHEMA, is_ms_shipped);
  - take exactly these parameters (read from sys.parameters: name, type,
    length, OUTPUT; order free, the dispatcher passes them by name; no other
    parameter, because sys.parameters cannot say whether a T-SQL parameter
    has a default: has_default_value "is always 0 for Transact-SQL objects",
    https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-parameters-transact-sql):
      @EventID BIGINT, @MailID BIGINT, @AppName NVARCHAR(128),
      @EventType NVARCHAR(32), @Status NVARCHAR(16), @SmtpCode INT,
      @Detail NVARCHAR(4000), @StopMail BIT OUTPUT,
      @StopReason NVARCHAR(4000) OUTPUT
  - have a readable definition (not WITH ENCRYPTION): it is pinned.
Pinning:     the row stores the object_id and SHA2_256 of OBJECT_DEFINITION;
             a hook altered, dropped or recreated later is suspended by the
             dispatcher (no call, the cursor stays, LastError says why) until
             this procedure is run again for it.
Cursor:      a new registration starts at the end of the stream (the events
             that commit from now on: MIN_ACTIVE_ROWVERSION() - 1, see
             mailq.GetMailEvents); a re-registration keeps the cursor and
             the retry state, so no event is passed twice or skipped.
             @ResetCursorTo (optional) puts the cursor at that EventID (0 =
             replay the application's whole stream still stored).
Parameters:  @AppName NVARCHAR(128), required, a registered application;
             @HookProcedure NVARCHAR(300): the hook, NULL = remove the hook;
             @MaxAttempts INT = 3: calls of a failing event before it is given
                 up (1-100);
             @ResetCursorTo BIGINT = NULL: see Cursor.
Result set:  one row: AppName, HookProcedure (NULL after a removal),
             ObjectId, CursorEventID, MaxAttempts, Changed BIT (0: removing a
             hook that was not there).
Errors:      50290 @AppName missing or not a registered application;
             50291 @HookProcedure not a two-part name of an existing SQL
                   procedure of this database, or a system procedure;
             50292 the procedure is in a schema not owned by dbo, or has
                   another owner;
             50293 the procedure's parameters differ from the hook signature
                   (the message lists what is missing, wrong or extra);
             50294 the definition cannot be read (WITH ENCRYPTION), so it
                   cannot be pinned;
             50295 @MaxAttempts outside 1-100, or @ResetCursorTo negative.
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms the caller's
             transaction, which the caller must roll back.  Validation runs
             before any transaction.
Isolation:   sets READ COMMITTED itself (UPDLOCK, HOLDLOCK update-else-insert;
             a level set in a procedure reverts when it returns).
Lock order:  mailq.ApplicationHook only (the application's row, key-range
             locked while absent).
Example:     EXEC mailq.SetApplicationHook @AppName = N'billing', @HookProcedure = N'billing.OnMailEvent';
             EXEC mailq.SetApplicationHook @AppName = N'billing', @HookProcedure = NULL;  -- remove
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
        @Changed BIT = 1;

    -- 1. Validate before any transaction starts.
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

        -- sys.objects.principal_id: the individual owner when it differs
        -- from the schema owner, else NULL.  dbo's principal_id is 1.
        IF @SchemaOwner <> 1 OR COALESCE(@ObjectOwner, 1) <> 1
        BEGIN
            SET @Msg = CONCAT(
                N'@HookProcedure ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
                N' must be in a schema owned by dbo and have no other owner: hooks run as dbo; schema owner ',
                QUOTENAME(USER_NAME(@SchemaOwner)), N', object owner ',
                COALESCE(QUOTENAME(USER_NAME(@ObjectOwner)), N'(the schema''s)'), N'.'
            );
            THROW 50292, @Msg, 1;
        END;

        -- The signature, from sys.parameters: what is missing or different,
        -- then what is extra.  Lengths are in bytes (NVARCHAR(n): 2n).
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

    -- 2. Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

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

            -- A new hook starts at the end of the stream: every event below
            -- MIN_ACTIVE_ROWVERSION() is committed, every later one will be
            -- above it (see mailq.GetMailEvents).
            IF @@ROWCOUNT = 0
                INSERT INTO mailq.ApplicationHook (
                    AppName, SchemaName, ProcedureName, ObjectId, DefinitionHash, MaxAttempts, CursorEventID
                )
                VALUES (
                    @AppName, @SchemaName, @Name, @ObjectId, @DefinitionHash, @MaxAttempts,
                    COALESCE(@ResetCursorTo, CAST(MIN_ACTIVE_ROWVERSION() AS BIGINT) - 1)
                );
        END;

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened; a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller.
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
