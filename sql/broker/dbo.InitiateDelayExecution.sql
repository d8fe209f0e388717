/*
dbo.InitiateDelayExecution: schedules an allow-listed procedure to run after a
delay: inserts one row into dbo.tabDIYTable12402, whose trigger writes the task.
Parameters (the source document's names and order): @F108211 NVARCHAR(MAX) target,
             N'schema.proc' or a bare N'proc' listed with AllowBareName = 1;
             @F108218 INT delay in seconds, 0-31,536,000 (0 = due now); @F108212 ...
             @F108216 NVARCHAR(MAX) = NULL the target's @Param1 ... @Param5 (copied now);
             @F108210 NVARCHAR(MAX) = NULL description; @TaskID BIGINT = NULL OUTPUT;
             @IdempotencyKey NVARCHAR(MAX) = NULL: a call resent with a key already
             used returns that call's task.  Text is checked, too long refused, never cut.
Result set:  one row: TaskID BIGINT (also in @TaskID).
Errors:      50301 @F108211 missing; 50302 delay outside 0-31,536,000; 50303 a value
             over 200 characters; 50304 malformed name or over 128 characters; 50305
             three or four parts; 50306 not on the allow-list; 50344 @F108210 over 50
             characters; 50345 @IdempotencyKey empty, over 100 characters or held by
             another call over 30 s.  A changed listed target is accepted (Held when due).
Transaction: its own if none is open, else the caller's.  Any error, a refusal
             included, dooms the caller's transaction (XACT_ABORT ON): the caller
             must roll back.  No savepoint (error 627 under MSDTC).  Validation first.  Isolation: READ COMMITTED.
Lock order:  the key's application lock, dbo.tabDIYTable12402 and its trigger's, delay.TaskKey.
Security:    runs as the caller (EXECUTE only); tables by ownership chaining, so the
             platform's own triggers fire with the caller's rights.
Example:     EXEC dbo.InitiateDelayExecution @F108211 = N'dbo.TCXG', @F108218 = 60, @F108212 = N'A-1';
*/
CREATE OR ALTER PROCEDURE dbo.InitiateDelayExecution
    @F108211 NVARCHAR(MAX),
    @F108218 INT,
    @F108212 NVARCHAR(MAX) = NULL,
    @F108213 NVARCHAR(MAX) = NULL,
    @F108214 NVARCHAR(MAX) = NULL,
    @F108215 NVARCHAR(MAX) = NULL,
    @F108216 NVARCHAR(MAX) = NULL,
    @F108210 NVARCHAR(MAX) = NULL,
    @TaskID BIGINT = NULL OUTPUT,
    @IdempotencyKey NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- The key read must see a task committed while this call waited for the key's lock.
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE
        @Msg NVARCHAR(2048), @Refusal INT, @RefusalMessage NVARCHAR(400), @TaskState NVARCHAR(16),
        @LockName NVARCHAR(255), @LockResult INT, @Bad SYSNAME, @BadLength BIGINT;
    SET @TaskID = NULL;
    -- 1. Validate before any transaction starts.  LEN(x + N'.') - 1 counts trailing blanks.
    IF NULLIF(@F108211, N'') IS NULL
        THROW 50301, N'@F108211 (target procedure name) is required.', 1;
    SELECT TOP (1) @Bad = v.Name, @BadLength = v.Length
    FROM (
        VALUES (N'@F108212', LEN(@F108212 + N'.') - 1), (N'@F108213', LEN(@F108213 + N'.') - 1),
        (N'@F108214', LEN(@F108214 + N'.') - 1), (N'@F108215', LEN(@F108215 + N'.') - 1),
        (N'@F108216', LEN(@F108216 + N'.') - 1)
    ) AS v(Name, Length)
    WHERE v.Length > 200
    ORDER BY v.Name;
    IF @Bad IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(@Bad, N' must be at most 200 characters (the target''s contract); got ', @BadLength, N'.');
        THROW 50303, @Msg, 1;
    END;
    IF LEN(@F108210 + N'.') - 1 > 50
    BEGIN
        SET @Msg = CONCAT(N'@F108210 (description) must be at most 50 characters; got ', LEN(@F108210 + N'.') - 1);
        THROW 50344, @Msg, 1;
    END;
    IF @IdempotencyKey IS NOT NULL AND (LEN(@IdempotencyKey + N'.') - 1 NOT BETWEEN 1 AND 100)
    BEGIN
        SET @Msg = CONCAT(N'@IdempotencyKey must be 1-100 characters; got ', LEN(@IdempotencyKey + N'.') - 1, N'.');
        THROW 50345, @Msg, 1;
    END;
    -- The delay and the name by the trigger's own rules (a name over 4000 characters is malformed).
    SELECT @Refusal = c.RefusalNumber, @RefusalMessage = c.RefusalMessage
    FROM delay.Classify(
        IIF(LEN(@F108211 + N'.') - 1 > 4000, N'', CAST(@F108211 AS NVARCHAR(4000))),
        ISNULL(CAST(@F108218 AS NVARCHAR(40)), N'null'), NULL, NULL, NULL, NULL, NULL
    ) AS c;
    IF @Refusal IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(IIF(@Refusal = 50302, N'@F108218: ', N'@F108211: '), @RefusalMessage, N'.');
        THROW @Refusal, @Msg, 1;
    END;
    -- 2. Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        IF @IdempotencyKey IS NOT NULL
        BEGIN
            -- On the key itself, not a key range (TSQL-STYLE); RTRIM: the lookup pads blanks too.
            SET @LockName = CONCAT(N'mailq-db/delay/key/',
                CONVERT(NVARCHAR(64), HASHBYTES('SHA2_256', RTRIM(@IdempotencyKey)), 2));
            EXEC @LockResult = sys.sp_getapplock
                @Resource = @LockName, @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 30000;
            IF @LockResult < 0
            BEGIN
                SET @Msg = CONCAT(N'@IdempotencyKey: another call held the key over 30 s (', @LockResult, N').');
                THROW 50345, @Msg, 1;
            END;
            SELECT @TaskID = k.TaskID FROM delay.TaskKey AS k WHERE k.IdempotencyKey = @IdempotencyKey;
        END;
        IF @TaskID IS NULL
        BEGIN
            INSERT INTO dbo.tabDIYTable12402 (
                F108210, F108211, F108212, F108213, F108214, F108215, F108216, F108218, F108219
            )
            VALUES (@F108210, @F108211, @F108212, @F108213, @F108214, @F108215, @F108216, @F108218, 0);
            -- SCOPE_IDENTITY, not @@IDENTITY: the trigger inserts into delay.Log.
            SET @TaskID = CAST(SCOPE_IDENTITY() AS BIGINT);
            -- The trigger classified the row again; the allow-list may have changed meanwhile.
            SELECT @TaskState = t.TaskState, @Refusal = t.LastErrorNumber, @RefusalMessage = t.LastErrorMessage
            FROM delay.Task AS t
            WHERE t.TaskID = @TaskID;
            IF @TaskState IS NULL OR @TaskState <> N'Pending'
            BEGIN
                SET @Msg = CONCAT(N'@F108211: ', ISNULL(@RefusalMessage, N'the task was not scheduled'), N'.');
                SET @Refusal = ISNULL(@Refusal, 50306);
                THROW @Refusal, @Msg, 1;
            END;
            IF @IdempotencyKey IS NOT NULL
                INSERT INTO delay.TaskKey (IdempotencyKey, TaskID) VALUES (@IdempotencyKey, @TaskID);
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened; a caller's transaction is doomed by XACT_ABORT.
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        SET @TaskID = NULL;
        THROW;
    END CATCH;
    SELECT TaskID = @TaskID;
END;
