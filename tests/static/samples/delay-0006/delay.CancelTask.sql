/*
delay.CancelTask: the work of dbo.CancelDelayExecution (see its header for the
contract, errors, transaction and lock order).  Internal: granted to nobody;
reached from dbo.CancelDelayExecution through ownership chaining, which also
passes the caller's login and whether the caller may cancel any task.
Parameters:  @TaskID BIGINT, @CallerLogin NVARCHAR(128), @MayCancelAny BIT
Errors:      50320, 50321, 50342, 50343 (docs/errors.md)
Security:    EXECUTE AS OWNER: BEGIN CONVERSATION TIMER and END CONVERSATION
             need the conversation's owner (dbo).
Example:     EXEC delay.CancelTask @TaskID = 42, @CallerLogin = N'app', @MayCancelAny = 0;
*/
CREATE OR ALTER PROCEDURE delay.CancelTask
    @TaskID BIGINT,
    @CallerLogin NVARCHAR(128),
    @MayCancelAny BIT
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- The UPDLOCK reads below must lock the latest committed row: READ COMMITTED
    -- whatever the caller runs under (a level set in a procedure reverts when it
    -- returns; under RCSI an UPDLOCK read still takes and honours locks).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE
        @Msg NVARCHAR(2048),
        @Handle UNIQUEIDENTIFIER,
        @TaskState NVARCHAR(16),
        @CreatedBy NVARCHAR(128),
        @LockName NVARCHAR(255),
        @LockResult INT;

    -- 1. Validate before any transaction starts.
    SELECT
        @Handle = t.ConversationHandle,
        @TaskState = t.TaskState,
        @CreatedBy = t.CreatedBy
    FROM delay.Task AS t
    WHERE t.TaskID = @TaskID;

    IF @TaskState IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID names no delayed task; got ', ISNULL(CAST(@TaskID AS NVARCHAR(20)), N'NULL'), N'.'
        );
        THROW 50320, @Msg, 1;
    END;

    IF ISNULL(@MayCancelAny, 0) = 0 AND (@CreatedBy IS NULL OR @CreatedBy <> @CallerLogin)
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID ', @TaskID, N' was initiated by another login; only MailqAdmin or db_owner ',
            N'may cancel it (caller: ', ISNULL(@CallerLogin, N'NULL'), N').'
        );
        THROW 50342, @Msg, 1;
    END;

    IF @TaskState NOT IN (N'Scheduled', N'Retrying') OR @Handle IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID ', @TaskID, N' is ', @TaskState,
            N'; only a Scheduled or Retrying task can be cancelled.'
        );
        THROW 50321, @Msg, 1;
    END;

    -- A conversation that no longer exists cannot be locked or ended; after
    -- ALTER DATABASE ... SET NEW_BROKER every conversation is gone and no
    -- EndDialog ever arrives.
    IF NOT EXISTS (
        SELECT 1 FROM sys.conversation_endpoints AS e
        WHERE e.conversation_handle = @Handle AND e.state NOT IN ('CD', 'ER', 'DI')
    )
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID ', @TaskID, N' has lost its conversation (a database copy with NEW_BROKER?); ',
            N'run EXEC delay.Reconcile, which re-arms or fails such tasks, then cancel again.'
        );
        THROW 50343, @Msg, 1;
    END;

    -- 2. Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1
            BEGIN TRANSACTION;

        -- The task's cancel lock first (a delay-0 request takes it too, so
        -- the two never wait for each other's conversation group), then
        -- the conversation group.
        SET @LockName = CONCAT(N'mailq-db/delay/cancel/', @TaskID);
        EXEC @LockResult = sys.sp_getapplock
            @Resource = @LockName,
            @LockMode = N'Exclusive',
            @LockOwner = N'Transaction',
            @LockTimeout = -1;
        IF @LockResult < 0
        BEGIN
            SET @Msg = CONCAT(N'@TaskID ', @TaskID, N': its cancel lock was not granted (', @LockResult, N').');
            THROW 50321, @Msg, 1;
        END;

        -- Lock order: the conversation group next.  The 1-second timer is
        -- only the lock: the task is either cancelled below (its conversation
        -- ends, timer and all) or refused, which dooms the transaction, so
        -- the timer never survives.
        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = 1;

        -- UPDLOCK: hold the row from this check to the state change, so the
        -- activation procedure cannot start the task in between.
        -- ROWLOCK: one task, one row lock.
        SELECT @TaskState = t.TaskState
        FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
        WHERE t.TaskID = @TaskID;

        IF @TaskState NOT IN (N'Scheduled', N'Retrying')
        BEGIN
            SET @Msg = CONCAT(
                N'@TaskID ', @TaskID, N' is ', @TaskState,
                N'; only a Scheduled or Retrying task can be cancelled.'
            );
            THROW 50321, @Msg, 1;
        END;

        SET @Msg = CONCAT(N'cancelled by ', @CallerLogin);
        EXEC delay.FinishTask
            @TaskID = @TaskID,
            @TaskState = N'Cancelled',
            @EventName = N'Cancelled',
            @ErrorMessage = @Msg;

        IF @OwnTran = 1
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened; a caller's transaction is doomed by
        -- XACT_ABORT and its own CATCH rolls it back.
        IF @OwnTran = 1 AND XACT_STATE() <> 0
            ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
