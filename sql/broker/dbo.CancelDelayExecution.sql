/*
dbo.CancelDelayExecution: cancels a task that is not running: a Pending or Held
task becomes Cancelled (receipt 4) and never runs.
Parameters:  @TaskID BIGINT: the ID dbo.InitiateDelayExecution returned
Errors:      50320 @TaskID names no task; 50321 the task is Claimed (a reader runs it
             or is about to), final (state named) or its row stays locked 2 s (a run
             holds it: never waited for); 1222 (transient) delay.Log or the platform
             row stays locked 2 s; 50342 another login's, caller not MailqAdmin/db_owner
Transaction: its own or the caller's; any error, a refusal included, dooms the
             caller's transaction (XACT_ABORT ON): the caller must roll back.  No
             savepoint (error 627 under MSDTC).  Validation runs first.  Isolation: READ COMMITTED.
Lock order:  the task's delay.Task row (UPDLOCK), delay.Log, dbo.tabDIYTable12402.
             Readers claim with READPAST: a cancel held open in a caller's
             transaction holds no reader.
Security:    runs as the caller (its roles decide; MailqDelayCaller cancels only its
             own login's tasks); tables by ownership chaining, the platform's
             triggers fire with the caller's rights.
Example:     EXEC dbo.CancelDelayExecution @TaskID = 42;
*/
CREATE OR ALTER PROCEDURE dbo.CancelDelayExecution
    @TaskID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- Both revert on return: the UPDLOCK read locks the latest committed row, waits 2 s at most.
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SET LOCK_TIMEOUT 2000;
    DECLARE
        @Msg NVARCHAR(2048), @TaskState NVARCHAR(16), @CreatedBy NVARCHAR(128), @Locked BIT = 0,
        @Caller NVARCHAR(128) = ORIGINAL_LOGIN(), @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0),
        @MayCancelAny BIT = IIF(IS_MEMBER(N'MailqAdmin') = 1 OR IS_MEMBER(N'db_owner') = 1, 1, 0);
    BEGIN TRY  -- 1. Validate before any transaction starts.
        SELECT @TaskState = t.TaskState, @CreatedBy = t.CreatedBy FROM delay.Task AS t WHERE t.TaskID = @TaskID;
        IF @TaskState IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@TaskID names no task; got ', ISNULL(CAST(@TaskID AS NVARCHAR(20)), N'NULL'), N'.');
            THROW 50320, @Msg, 1;
        END;
        IF @MayCancelAny = 0 AND (@CreatedBy IS NULL OR @CreatedBy <> @Caller)
        BEGIN
            SET @Msg = CONCAT(N'@TaskID ', @TaskID, N' was initiated by another login; only MailqAdmin or ',
                N'db_owner may cancel it (caller: ', ISNULL(@Caller, N'NULL'), N').');
            THROW 50342, @Msg, 1;
        END;
        IF @OwnTran = 1 BEGIN TRANSACTION;  -- 2. Our own if none is open, else the caller's.
        -- UPDLOCK, ROWLOCK: hold the row from the check to the change; @Locked: it is held.
        SELECT @TaskState = t.TaskState, @Locked = 1
        FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK) WHERE t.TaskID = @TaskID;
        IF @TaskState NOT IN (N'Pending', N'Held')
        BEGIN
            SET @Msg = CONCAT(N'@TaskID ', @TaskID, N' is ', @TaskState, N'; only Pending or Held ones are.');
            THROW 50321, @Msg, 1;
        END;
        UPDATE t
        SET
            t.TaskState = N'Cancelled', t.FinishedAtUtc = SYSUTCDATETIME(), t.LastErrorNumber = NULL,
            t.LastErrorMessage = CONCAT(N'cancelled by ', @Caller)
        FROM delay.Task AS t
        WHERE t.TaskID = @TaskID;
        INSERT INTO delay.Log (TaskID, EventName, TargetName, ErrorMessage)
        SELECT t.TaskID, N'Cancelled', t.TargetName, t.LastErrorMessage FROM delay.Task AS t WHERE t.TaskID = @TaskID;
        UPDATE p SET p.F108219 = 4 FROM dbo.tabDIYTable12402 AS p WHERE p.ID = @TaskID;  -- by ID only
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;  -- only ours: a caller's is doomed
        IF ERROR_NUMBER() <> 1222 OR @Locked = 1 THROW;  -- a write's lock timeout is no run
        SET @Msg = CONCAT(N'@TaskID ', @TaskID, N' stayed locked 2 s: a reader runs it; only Pending or Held ones are');
        THROW 50321, @Msg, 1;
    END CATCH;
END;
