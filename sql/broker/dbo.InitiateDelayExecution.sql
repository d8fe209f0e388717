/*
dbo.InitiateDelayExecution: schedules one allow-listed procedure to run after a
delay; inserts one row into dbo.tabDIYTable12402, whose trigger schedules it.
Parameters (the source document's names and order):
    @F108211 NVARCHAR(MAX)   target procedure: N'schema.proc', or a bare N'proc'
                             listed with AllowBareName = 1 (see delay.AllowProcedure)
    @F108218 INT             delay in seconds, 0-31,536,000 (365 days)
    @F108212 ... @F108216 NVARCHAR(MAX) = NULL: the target's @Param1 ... @Param5,
                             at most 200 characters each (the target's contract)
    @F108210 NVARCHAR(MAX) = NULL  description (the platform's F108210), at most
                             50 characters
    @TaskID  BIGINT = NULL OUTPUT  the new task's ID (dbo.tabDIYTable12402.ID)
    @IdempotencyKey NVARCHAR(MAX) = NULL  at most 100 characters: a call resent
                             with a key already used returns that first call's
                             task (result and @TaskID) and schedules nothing
Lengths:     every text parameter is declared MAX and checked, so a value longer
             than its column is refused (50303, 50304, 50344, 50345), never cut
             (SQL Server silently truncates a value passed to a shorter
             parameter).  Lengths count trailing blanks.
Result set:  one row, one column: TaskID BIGINT (the same value as @TaskID), for
             clients that read a result rather than an OUTPUT parameter.
Errors:      50301 @F108211 missing; 50302 @F108218 outside 0-31,536,000;
             50303 a parameter longer than 200 characters;
             50304 @F108211 malformed or longer than 128 characters;
             50305 @F108211 has three or four parts; 50306 not on the allow-list;
             50307 listed, but the procedure was dropped, recreated or moved;
             50340 listed, but its definition changed since it was listed;
             50344 @F108210 longer than 50 characters;
             50345 @IdempotencyKey empty or longer than 100 characters, or
                   another call with the same key held it for over 30 s
Transaction: opens its own if none is open, else works inside the caller's.
             Any error, a refusal included, dooms the caller's transaction
             (XACT_ABORT ON) and is re-raised: the caller must roll back.  No
             savepoint: a savepoint fails inside a distributed (MSDTC)
             transaction (error 627), and a doomed transaction cannot return
             to one.  Validation runs before any work.  The task is scheduled
             when that transaction commits; if it rolls back, nothing is.
Lock order:  with a key, an application lock on the key (transaction-owned),
             then dbo.tabDIYTable12402 (the INSERT), then its trigger's
             delay.Task rows and conversations.
Security:    EXECUTE AS OWNER (dbo) so that name resolution sees every procedure
             in sys.objects; callers need only EXECUTE (role MailqDelayCaller).
             The task records ORIGINAL_LOGIN() as its owner (delay.Task.CreatedBy).
Example:     DECLARE @TaskID BIGINT;
             EXEC dbo.InitiateDelayExecution @F108211 = N'dbo.TCXG', @F108218 = 60,
                 @F108212 = N'A-1', @TaskID = @TaskID OUTPUT;
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
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- READ COMMITTED whatever the caller runs under (a level set in a
    -- procedure reverts when it returns): the idempotency-key read below must
    -- see a task that another call with the same key committed while we
    -- waited for the key's lock.  Under a caller's SNAPSHOT it would read the
    -- snapshot taken before that commit, miss the task, insert a second row
    -- and fail on UX_Task_IdempotencyKey instead of returning the first task.
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE
        @Msg NVARCHAR(2048),
        @MaxDelaySeconds INT = 31536000,
        @BadParameter SYSNAME,
        @BadLength BIGINT,
        @Refusal INT,
        @RefusalMessage NVARCHAR(400),
        @TaskState NVARCHAR(16),
        @LockName NVARCHAR(255),
        @LockResult INT;

    SET @TaskID = NULL;

    -- 1. Validate parameters before any transaction starts.
    IF NULLIF(@F108211, N'') IS NULL
        THROW 50301, N'@F108211 (target procedure name) is required.', 1;

    IF @F108218 IS NULL OR @F108218 NOT BETWEEN 0 AND @MaxDelaySeconds
    BEGIN
        SET @Msg = CONCAT(
            N'@F108218 (delay) must be 0-', @MaxDelaySeconds, N' seconds; got ',
            ISNULL(CAST(@F108218 AS NVARCHAR(20)), N'NULL'), N'.'
        );
        THROW 50302, @Msg, 1;
    END;

    SELECT TOP (1)
        @BadParameter = v.ParameterName,
        @BadLength = v.ValueLength
    FROM (
        VALUES
        -- LEN(x + N'.') - 1 counts trailing blanks, which LEN ignores.
        (N'@F108212', LEN(@F108212 + N'.') - 1),
        (N'@F108213', LEN(@F108213 + N'.') - 1),
        (N'@F108214', LEN(@F108214 + N'.') - 1),
        (N'@F108215', LEN(@F108215 + N'.') - 1),
        (N'@F108216', LEN(@F108216 + N'.') - 1)
    ) AS v(ParameterName, ValueLength)
    WHERE v.ValueLength > 200
    ORDER BY v.ParameterName;

    IF @BadParameter IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(
            @BadParameter, N' must be at most 200 characters (the target''s @Param contract); got ',
            @BadLength, N'.'
        );
        THROW 50303, @Msg, 1;
    END;

    IF LEN(@F108210 + N'.') - 1 > 50
    BEGIN
        SET @Msg = CONCAT(
            N'@F108210 (description) must be at most 50 characters; got ', LEN(@F108210 + N'.') - 1, N'.'
        );
        THROW 50344, @Msg, 1;
    END;

    IF @IdempotencyKey IS NOT NULL AND (LEN(@IdempotencyKey + N'.') - 1 NOT BETWEEN 1 AND 100)
    BEGIN
        SET @Msg = CONCAT(
            N'@IdempotencyKey must be 1-100 characters; got ', LEN(@IdempotencyKey + N'.') - 1, N'.'
        );
        THROW 50345, @Msg, 1;
    END;

    -- ResolveTarget takes NVARCHAR(4000); a longer name is malformed anyway
    -- (50304 for anything over 128 characters).
    SELECT
        @Refusal = r.RefusalNumber,
        @RefusalMessage = r.RefusalMessage
    FROM delay.ResolveTarget(
        IIF(LEN(@F108211 + N'.') - 1 > 4000, N'', CAST(@F108211 AS NVARCHAR(4000)))
    ) AS r;

    IF @Refusal IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(N'@F108211: ', @RefusalMessage, N'.');
        THROW @Refusal, @Msg, 1;
    END;

    -- 2. Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1
            BEGIN TRANSACTION;

        IF @IdempotencyKey IS NOT NULL
        BEGIN
            -- Serialize on the key itself, not on a key range (TSQL-STYLE:
            -- UPDLOCK, HOLDLOCK on an absent key locks the whole gap).
            -- Transaction-owned: released when the caller's transaction ends.
            SET @LockName = CONCAT(
                N'mailq-db/delay/key/', CONVERT(NVARCHAR(64), HASHBYTES('SHA2_256', @IdempotencyKey), 2)
            );
            EXEC @LockResult = sys.sp_getapplock
                @Resource = @LockName,
                @LockMode = N'Exclusive',
                @LockOwner = N'Transaction',
                @LockTimeout = 30000;
            IF @LockResult < 0
            BEGIN
                SET @Msg = CONCAT(
                    N'@IdempotencyKey: another call with the same key did not finish within 30 s (',
                    @LockResult, N').'
                );
                THROW 50345, @Msg, 1;
            END;

            SELECT @TaskID = t.TaskID
            FROM delay.Task AS t
            WHERE t.IdempotencyKey = @IdempotencyKey;
        END;

        IF @TaskID IS NULL
        BEGIN
            INSERT INTO dbo.tabDIYTable12402 (
                F108210, F108211, F108212, F108213, F108214, F108215, F108216, F108218, F108219
            )
            VALUES (@F108210, @F108211, @F108212, @F108213, @F108214, @F108215, @F108216, @F108218, 0);

            -- SCOPE_IDENTITY, not @@IDENTITY: the trigger inserts into delay.Log,
            -- which has an identity of its own.
            SET @TaskID = CAST(SCOPE_IDENTITY() AS BIGINT);

            -- The trigger resolved the name again; the allow-list may have changed
            -- in between.
            SELECT
                @TaskState = t.TaskState,
                @Refusal = t.LastErrorNumber,
                @RefusalMessage = t.LastErrorMessage
            FROM delay.Task AS t
            WHERE t.TaskID = @TaskID;

            IF @TaskState IS NULL OR @TaskState <> N'Scheduled'
            BEGIN
                SET @Msg = CONCAT(N'@F108211: ', ISNULL(@RefusalMessage, N'the task was not scheduled'), N'.');
                SET @Refusal = ISNULL(@Refusal, 50306);
                THROW @Refusal, @Msg, 1;
            END;

            IF @IdempotencyKey IS NOT NULL
                UPDATE delay.Task
                SET IdempotencyKey = @IdempotencyKey
                WHERE TaskID = @TaskID;
        END;

        IF @OwnTran = 1
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened; a caller's transaction is doomed by
        -- XACT_ABORT and its own CATCH rolls it back.
        IF @OwnTran = 1 AND XACT_STATE() <> 0
            ROLLBACK TRANSACTION;
        SET @TaskID = NULL;
        THROW;
    END CATCH;

    SELECT TaskID = @TaskID;
END;
