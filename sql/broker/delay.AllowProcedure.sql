/*
delay.AllowProcedure: lists a procedure for delayed execution, or lists it again
after a review of a change: pins its definition (object_id, SHA2_256), grants
EXECUTE on it to MailqRunner (the user every target runs as), and releases its
Held tasks (Pending, due now).
Parameters:  @ProcedureName NVARCHAR(4000): N'dbo.TCXG' or N'[dbo].[TCXG]', an existing
                 SQL procedure of this database taking @SPName, @Param1 ... @Param5
             @AllowBareName BIT = 0: 1 lets the bare name (N'TCXG') resolve to it
             @MaxReaders INT = NULL: readers that may run it at once (1-32767); NULL:
                 one fewer than MAX_QUEUE_READERS, at least 1
Result set:  one row: AllowedProcedureId, SchemaName, ProcedureName, ObjectId,
             AllowBareName, MaxReaders, Released INT (Held tasks released)
Errors:      50310 not a two-part name of an existing SQL procedure here; 50311 a
             system procedure; 50312 a parameter of the contract is missing; 50313 the
             bare name answers to another entry; 50341 no readable definition (WITH
             ENCRYPTION): cannot be pinned; 50542 @MaxReaders outside 1-32767
Transaction: its own or the caller's; any error dooms either and is re-raised.  Isolation: READ COMMITTED.
Lock order:  delay.AllowedProcedure, delay.Task (Held rows), delay.Log, delay.ArmDispatcher's.
Security:    for db_owner only (no role is granted EXECUTE; the GRANT needs it).
Example:     EXEC delay.AllowProcedure @ProcedureName = N'dbo.TCXG', @AllowBareName = 1;
*/
CREATE OR ALTER PROCEDURE delay.AllowProcedure
    @ProcedureName NVARCHAR(4000),
    @AllowBareName BIT = 0,
    @MaxReaders INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- The UPDLOCK reads below must lock the latest committed row (reverts on return).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE
        @Msg NVARCHAR(2048), @SchemaName SYSNAME, @Name SYSNAME, @ObjectId INT, @IsShipped BIT,
        @Missing NVARCHAR(200), @Hash VARBINARY(32), @Grant NVARCHAR(400), @Released INT = 0,
        @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Release TABLE (TaskID BIGINT NOT NULL PRIMARY KEY, TargetName NVARCHAR(400) NULL);
    -- 1. Validate before any transaction starts.  PARSENAME takes a sysname: refuse what it would cut.
    SET @AllowBareName = ISNULL(@AllowBareName, 0);
    IF @MaxReaders NOT BETWEEN 1 AND 32767
    BEGIN
        SET @Msg = CONCAT(N'@MaxReaders must be 1-32767 or NULL; got ', @MaxReaders, N'.');
        THROW 50542, @Msg, 1;
    END;
    SELECT @ObjectId = o.object_id, @SchemaName = s.name, @Name = o.name, @IsShipped = o.is_ms_shipped
    FROM sys.objects AS o
    INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
    WHERE
        DATALENGTH(@ProcedureName) BETWEEN 2 AND 256 AND PARSENAME(@ProcedureName, 3) IS NULL
        AND s.name = PARSENAME(@ProcedureName, 2) AND o.name = PARSENAME(@ProcedureName, 1) AND o.type = 'P';
    IF @ObjectId IS NULL
    BEGIN
        SET @Msg = CONCAT(N'@ProcedureName must be schema.procedure naming an existing SQL procedure here; got ',
            ISNULL(LEFT(@ProcedureName, 300), N'NULL'), N'.');
        THROW 50310, @Msg, 1;
    END;
    IF @IsShipped = 1 OR @SchemaName IN (N'sys', N'INFORMATION_SCHEMA')
    BEGIN
        SET @Msg = CONCAT(N'@ProcedureName must not be a system procedure; got ', @ProcedureName, N'.');
        THROW 50311, @Msg, 1;
    END;
    SELECT @Missing = STRING_AGG(c.ParameterName, N', ') WITHIN GROUP (ORDER BY c.ParameterName)
    FROM (VALUES (N'@SPName'), (N'@Param1'), (N'@Param2'), (N'@Param3'), (N'@Param4'), (N'@Param5')) AS c(ParameterName)
    WHERE NOT EXISTS (SELECT 1 FROM sys.parameters AS p WHERE p.object_id = @ObjectId AND p.name = c.ParameterName);
    IF @Missing IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(N'@ProcedureName ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
            N' must take the target contract''s parameters; it lacks ', @Missing, N'.');
        THROW 50312, @Msg, 1;
    END;
    SET @Hash = HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId));
    IF @Hash IS NULL
    BEGIN
        SET @Msg = CONCAT(N'@ProcedureName ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
            N' has no readable definition (WITH ENCRYPTION?), so it cannot be pinned.');
        THROW 50341, @Msg, 1;
    END;
    -- 2. Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK, HOLDLOCK: the range lock keeps two sessions from both seeing the bare name free.
        IF @AllowBareName = 1 AND EXISTS (
            SELECT 1 FROM delay.AllowedProcedure AS ap WITH (UPDLOCK, HOLDLOCK)
            WHERE ap.ProcedureName = @Name AND ap.AllowBareName = 1 AND ap.SchemaName <> @SchemaName
        )
        BEGIN
            SET @Msg = CONCAT(N'@AllowBareName = 1, but the bare name ', @Name, N' already resolves to another entry.');
            THROW 50313, @Msg, 1;
        END;
        -- UPDLOCK, HOLDLOCK: update-else-insert without a race between the two.
        UPDATE ap
        SET
            ap.ObjectId = @ObjectId, ap.DefinitionHash = @Hash, ap.AllowBareName = @AllowBareName,
            ap.MaxReaders = @MaxReaders, ap.ListedAtUtc = @Now, ap.ListedBy = ORIGINAL_LOGIN()
        FROM delay.AllowedProcedure AS ap WITH (UPDLOCK, HOLDLOCK)
        WHERE ap.SchemaName = @SchemaName AND ap.ProcedureName = @Name;
        IF @@ROWCOUNT = 0
            INSERT INTO delay.AllowedProcedure (
                SchemaName, ProcedureName, ObjectId, AllowBareName, MaxReaders, DefinitionHash
            )
            VALUES (@SchemaName, @Name, @ObjectId, @AllowBareName, @MaxReaders, @Hash);
        -- The allow-list is a grant to MailqRunner, which targets run as (QUOTENAMEd catalog names).
        SET @Grant = CONCAT(N'GRANT EXECUTE ON OBJECT::', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
            N' TO MailqRunner;');
        EXEC sys.sp_executesql @Grant;
        -- Its Held tasks run now: listing it again is the review of the change.
        UPDATE t
        SET t.TaskState = N'Pending', t.NextRunAtUtc = @Now, t.LastErrorNumber = NULL, t.LastErrorMessage = NULL
        OUTPUT inserted.TaskID, inserted.TargetName INTO @Release (TaskID, TargetName)
        FROM delay.Task AS t WITH (INDEX (IX_Task_Due))
        WHERE t.TaskState = N'Held' AND t.SchemaName = @SchemaName AND t.ProcedureName = @Name;
        SET @Released = @@ROWCOUNT;
        INSERT INTO delay.Log (TaskID, EventName, TargetName)
        SELECT r.TaskID, N'Released', r.TargetName FROM @Release AS r;
        IF @Released > 0
            EXEC delay.ArmDispatcher @DueAtUtc = @Now;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT ap.AllowedProcedureId, ap.SchemaName, ap.ProcedureName, ap.ObjectId, ap.AllowBareName, ap.MaxReaders,
        @Released AS Released
    FROM delay.AllowedProcedure AS ap
    WHERE ap.SchemaName = @SchemaName AND ap.ProcedureName = @Name;
END;
