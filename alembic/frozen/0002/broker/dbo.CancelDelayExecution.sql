/*
dbo.CancelDelayExecution: cancels a task that has not started: its receipt
becomes 4, its conversation ends (which drops its timer), and it never runs.
Parameters:  @TaskID BIGINT, required: the ID InitiateDelayExecution returned
             (dbo.tabDIYTable12402.ID)
Result set:  none.
Errors:      50320 @TaskID missing or names no scheduled task
             50321 the task is not Scheduled or Retrying (already running or
                   finished; the message names its state)
Transaction: joins the caller's via a savepoint, else opens its own.
Locks:       takes the task's conversation group first (BEGIN CONVERSATION
             TIMER locks it), then the task row with UPDLOCK, the order that
             dbo.ProcessDelayQueue uses, so the two never deadlock on a task.
             The 1-second timer is harmless: if the task turns out not to be
             cancellable, the rollback to our savepoint restores the timer.
Security:    EXECUTE AS OWNER: END CONVERSATION needs the conversation's owner
             (dbo, who began it in the trigger); callers need only EXECUTE
             (role MailqDelayCaller).
Example:     EXEC dbo.CancelDelayExecution @TaskID = 42;
*/
CREATE OR ALTER PROCEDURE dbo.CancelDelayExecution
    @TaskID BIGINT
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE
        @Msg NVARCHAR(2048),
        @Handle UNIQUEIDENTIFIER,
        @TaskState NVARCHAR(16);

    -- 1. Validate parameters before any transaction starts.
    SELECT
        @Handle = t.ConversationHandle,
        @TaskState = t.TaskState
    FROM delay.Task AS t
    WHERE t.TaskID = @TaskID;

    IF @TaskState IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID names no delayed task; got ', ISNULL(CAST(@TaskID AS NVARCHAR(20)), N'NULL'), N'.'
        );
        THROW 50320, @Msg, 1;
    END;

    IF @TaskState NOT IN (N'Scheduled', N'Retrying') OR @Handle IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID ', @TaskID, N' is ', @TaskState,
            N'; only a Scheduled or Retrying task can be cancelled.'
        );
        THROW 50321, @Msg, 1;
    END;

    -- 2. Own the transaction, or nest in the caller's with a savepoint.
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0
            BEGIN TRANSACTION;
        ELSE
            SAVE TRANSACTION CancelDelayExecution;

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

        SET @Msg = CONCAT(N'cancelled by ', ORIGINAL_LOGIN());
        EXEC delay.FinishTask
            @TaskID = @TaskID,
            @TaskState = N'Cancelled',
            @EventName = N'Cancelled',
            @ErrorMessage = @Msg;

        IF @TranCount = 0
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION CancelDelayExecution;   -- undo only our work
        THROW;
    END CATCH;
END;
