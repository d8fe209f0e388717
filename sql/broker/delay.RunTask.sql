/*
delay.RunTask: runs one claimed task: its target in a transaction T of its own,
as MailqRunner, with the outcome committed in T with the target's work.
Parameters:  @TaskID BIGINT, @ClaimToken UNIQUEIDENTIFIER: the reader's claim
Steps in T:  1. the run lock: an UPDATE of the task's row for this claim (held until T
             ends: the sweep reads past it; a claim swept meanwhile is left alone);
             2. delay.CheckTarget: Held or Refused is recorded, nothing runs; 3. a slot
             of the target (at most MaxReaders readers run it at once) and the run's
             session lock (the sweep skips it even if the target ends T), else Pending
             again in 2 s; 4. EXECUTE AS USER = N'MailqRunner', one SET line, the target
             through sp_executesql, REVERT; 5. delay.CheckTarget again: the same
             ObjectId, ModifyDate and hash, else rolled back and Held (50540); 6. Done.
Failures:    T is rolled back and the failure recorded in a short transaction: Pending
             after a backoff, or Failed (attempts used up; the target ended the
             transaction opened for it, 266: not run again; claimed too often, 50541).
Errors:      a target's are recorded, never raised; our own bookkeeping's are raised.
Isolation:   READ COMMITTED.  Lock order: the task row, the slot (an application lock),
             whatever the target locks, delay.ReceiptDue, delay.Log.
Example:     EXEC delay.RunTask @TaskID = 42, @ClaimToken = @Token;   -- delay.RunDueTasks only
*/
CREATE OR ALTER PROCEDURE delay.RunTask
    @TaskID BIGINT,
    @ClaimToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE
        @Now DATETIME2(3) = SYSUTCDATETIME(), @SchemaName SYSNAME, @ProcedureName SYSNAME, @SPName NVARCHAR(200),
        @P1 NVARCHAR(200), @P2 NVARCHAR(200), @P3 NVARCHAR(200), @P4 NVARCHAR(200), @P5 NVARCHAR(200),
        @Claims INT, @Verdict NVARCHAR(8), @Reason INT, @ObjectId INT, @Modified DATETIME, @Hash VARBINARY(32),
        @Cap INT, @Slot INT = 0, @Lock INT = -1, @LockName NVARCHAR(255), @Sql NVARCHAR(MAX), @Error INT,
        @Message NVARCHAR(2048), @TranCount INT, @GiveUp BIT = 0, @MaxAttempts INT = 3, @RetryBase INT = 30,
        @RetryMax INT = 3600, @LockTimeoutMs INT = 30000, @Attempts INT, @State NVARCHAR(16), @Event NVARCHAR(16),
        @NextRun DATETIME2(3), @Ran BIT = 0;
    SELECT @MaxAttempts = s.MaxAttempts, @RetryBase = s.RetryBaseSeconds, @RetryMax = s.RetryMaxSeconds,
        @LockTimeoutMs = s.TargetLockTimeoutMs FROM delay.Setting AS s WHERE s.SettingId = 1;
    BEGIN TRANSACTION;
    -- 1. The run lock; the far lease marks the run (if the target commits T, no sweep
    --    claims it again; delay.Monitor fails it if its reader ends).
    UPDATE t
    SET
        t.LeaseUntilUtc = '9999-12-31', @SchemaName = t.SchemaName, @ProcedureName = t.ProcedureName,
        @SPName = LEFT(t.TargetName, 200), @P1 = t.Param1, @P2 = t.Param2, @P3 = t.Param3, @P4 = t.Param4,
        @P5 = t.Param5, @Claims = t.Claims, @Attempts = t.Attempts, @NextRun = t.NextRunAtUtc
    FROM delay.Task AS t WITH (ROWLOCK)
    WHERE t.TaskID = @TaskID AND t.ClaimToken = @ClaimToken AND t.TaskState = N'Claimed';
    IF @@ROWCOUNT = 0
    BEGIN
        ROLLBACK TRANSACTION;
        RETURN;
    END;
    -- 2. Is the target still what was listed?
    SELECT
        @Verdict = IIF(@Claims > @MaxAttempts + 3, N'Failed', c.Verdict),
        @Reason = IIF(@Claims > @MaxAttempts + 3, 50541, c.Reason),
        @ObjectId = c.ObjectId, @Modified = c.ModifyDate, @Hash = c.DefinitionHash, @Cap = c.MaxReaders
    FROM delay.CheckTarget(@SchemaName, @ProcedureName) AS c;
    SELECT @Cap = COALESCE(@Cap, NULLIF(q.max_readers - 1, 0), 1) FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue');
    -- 3. A slot of this target (transaction-owned: released when T ends).
    WHILE @Verdict = N'Run' AND @Lock < 0 AND @Slot < @Cap
    BEGIN
        SELECT @Slot += 1, @LockName = CONCAT(N'mailq-db/delay/slot/', @ObjectId, N'/', @Slot);
        EXEC @Lock = sys.sp_getapplock
            @Resource = @LockName, @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 0;
    END;
    -- The run's session lock: held for the run even if the target ends T (the sweep tests it).
    SET @LockName = CONCAT(N'mailq-db/delay/run/', @TaskID);
    IF @Verdict = N'Run' AND @Lock >= 0
        EXEC @Lock = sys.sp_getapplock
            @Resource = @LockName, @LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = 0;
    IF @Verdict = N'Run' AND @Lock >= 0
    BEGIN
        -- 4. Only QUOTENAMEd catalog names reach the text, values are parameters.  The SET
        --    line: a target never inherits the reader's session; SETs revert on return.
        SET @Sql = CONCAT(
            N'SET ANSI_NULLS, ANSI_WARNINGS, ANSI_PADDING, QUOTED_IDENTIFIER, ARITHABORT, CONCAT_NULL_YIELDS_NULL ',
            N'ON; SET NUMERIC_ROUNDABORT OFF; SET XACT_ABORT OFF; SET DEADLOCK_PRIORITY NORMAL; SET LOCK_TIMEOUT ',
            @LockTimeoutMs, N'; EXEC ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@ProcedureName),
            N' @SPName = @SPName, @Param1 = @P1, @Param2 = @P2, @Param3 = @P3, @Param4 = @P4, @Param5 = @P5;'
        );
        -- REVERT undoes only its own module's EXECUTE AS: the target can neither keep nor undo this one.
        EXECUTE AS USER = N'MailqRunner';
        BEGIN TRY
            EXEC sys.sp_executesql @Sql,
                N'@SPName NVARCHAR(200), @P1 NVARCHAR(200), @P2 NVARCHAR(200), @P3 NVARCHAR(200),
                  @P4 NVARCHAR(200), @P5 NVARCHAR(200)',
                @SPName = @SPName, @P1 = @P1, @P2 = @P2, @P3 = @P3, @P4 = @P4, @P5 = @P5;
        END TRY
        BEGIN CATCH
            SELECT @Error = ERROR_NUMBER(), @Message = LEFT(ERROR_MESSAGE(), 2048), @TranCount = @@TRANCOUNT;
        END CATCH;
        REVERT;
        EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';
        -- 5. The code that ran is the code that was checked.
        IF @Error IS NULL AND @@TRANCOUNT = 1 AND XACT_STATE() = 1 AND NOT EXISTS (
            SELECT 1 FROM delay.CheckTarget(@SchemaName, @ProcedureName) AS c
            WHERE
                c.Verdict = N'Run' AND c.ObjectId = @ObjectId AND c.ModifyDate = @Modified
                AND c.DefinitionHash = @Hash
        )
            SELECT @Error = 50540, @Message = N'the target was altered or replaced while it was called: rolled back';
        -- A failure: undo all.  266 with none left open: the target ended the transaction
        -- opened for it (its work may be committed: not run again); else 50335.
        SELECT @Ran = 1, @TranCount = ISNULL(@TranCount, @@TRANCOUNT);
        IF @Error IS NOT NULL OR @@TRANCOUNT <> 1 OR XACT_STATE() <> 1
        BEGIN
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            SET @GiveUp = IIF(@Error = 266 AND @TranCount = 0, 1, 0);
            SET @Error = IIF((@Error = 266 AND @TranCount > 0) OR @Error IS NULL, 50335, @Error);
            BEGIN TRANSACTION;
        END;
    END;
    -- 6. The outcome, in T with the target's work (Done) or after a failure's rollback.
    SELECT
        @State = CASE
            WHEN @Verdict <> N'Run' THEN @Verdict
            WHEN @Ran = 0 THEN N'Pending'
            WHEN @Error IS NULL THEN N'Done'
            WHEN @Error = 50540 THEN N'Held'
            WHEN @GiveUp = 1 OR @Attempts + 1 >= @MaxAttempts THEN N'Failed'
            ELSE N'Pending'
        END,
        -- 50306 disallowed, 50307 gone or recreated, 50340 changed, 50541 claimed too often.
        @Message = COALESCE(@Message, IIF(@Reason IS NULL, NULL, CONCAT(QUOTENAME(@SchemaName), N'.',
            QUOTENAME(@ProcedureName), IIF(@Reason = 50541, N': claimed too often without an outcome',
            N': not the listed procedure'), N' (', @Reason, N', docs/errors.md)')));
    SELECT
        @Event = CASE
            WHEN @State IN (N'Held', N'Refused') THEN @State
            WHEN @State = N'Failed' THEN N'GaveUp'
            WHEN @State = N'Pending' AND @Ran = 1 THEN N'Failed'
        END,
        @NextRun = CASE
            WHEN @State <> N'Pending' THEN @NextRun
            WHEN @Ran = 0 THEN DATEADD(SECOND, 2, @Now)
            ELSE DATEADD(SECOND, IIF(
                @RetryBase * POWER(CAST(4 AS BIGINT), IIF(@Attempts > 10, 10, @Attempts)) > @RetryMax, @RetryMax,
                @RetryBase * POWER(CAST(4 AS BIGINT), IIF(@Attempts > 10, 10, @Attempts))
            ), @Now)
        END;
    UPDATE t
    SET
        t.TaskState = @State, t.Attempts = t.Attempts + @Ran, t.NextRunAtUtc = @NextRun,
        t.Claims = t.Claims - IIF(@Ran = 0 AND @State IN (N'Pending', N'Held'), 1, 0),   -- not run: no claim
        t.FirstStartedAtUtc = IIF(@Ran = 1, ISNULL(t.FirstStartedAtUtc, @Now), t.FirstStartedAtUtc),
        t.LastStartedAtUtc = IIF(@Ran = 1, @Now, t.LastStartedAtUtc),
        t.FinishedAtUtc = IIF(@State IN (N'Done', N'Failed', N'Refused'), SYSUTCDATETIME(), NULL),
        t.ClaimToken = NULL, t.LeaseUntilUtc = NULL,
        t.LastErrorNumber = COALESCE(@Error, @Reason, t.LastErrorNumber),
        t.LastErrorMessage = COALESCE(@Message, t.LastErrorMessage)
    FROM delay.Task AS t
    WHERE t.TaskID = @TaskID AND t.ClaimToken = @ClaimToken;   -- after a rollback a sweep may own it
    IF @@ROWCOUNT = 0 SELECT @State = NULL, @Event = NULL;
    IF @State IN (N'Done', N'Failed', N'Refused')
        INSERT INTO delay.ReceiptDue (TaskID) VALUES (@TaskID);
    IF @Event IS NOT NULL
        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage)
        VALUES (@TaskID, @Event, @SPName, @Attempts + @Ran, COALESCE(@Error, @Reason), @Message);
    COMMIT TRANSACTION;
END;
