/*
mailq.StartHookDispatcher: starts, re-times or stops the self-re-arming hook
dispatcher of delayed execution (docs/hooks.md, "With delayed execution").
Deployed with delayed execution only (sql/broker/); without it (Azure SQL
Database) run mailq.RunApplicationHooks from an Agent or elastic job.
Start (@Enabled = 1): if a dispatcher task of the current generation is
pending (delay.Task Scheduled, Running or Retrying), only IntervalSeconds
changes (the next re-arm uses it) and no task is added; otherwise the
generation moves on and one task is scheduled at once (delay 0) with the
idempotency key InstanceKey + generation.  So there is at most one pending
dispatcher task, and starting twice is harmless.
Stop (@Enabled = 0): the generation moves on and Enabled = 0: the pending
task, when it runs, is stale and neither runs hooks nor re-arms (it is not
cancelled: cancelling races its own start, and a stale run costs nothing).
Parameters:  @IntervalSeconds INT = 30: seconds between two runs (1-3600);
             @Enabled BIT = 1: 1 start, 0 stop.
Result set:  one row: Enabled, IntervalSeconds, Generation, TaskID (the task
             of the current generation), TaskState (its delay.Task state, NULL
             when none), Scheduled BIT (1: this call scheduled a task).
Errors:      50295 @IntervalSeconds outside 1-3600; errors of
             dbo.InitiateDelayExecution pass through (e.g. 50306/50340: the
             task procedure is not allow-listed or its pin is stale: a
             db_owner runs EXEC delay.AllowProcedure @ProcedureName =
             N'mailq.HookDispatcherTask').
Transaction: opens its own if none is open, else works inside the caller's
             (the task is scheduled when that transaction commits; no
             savepoint: error 627 under MSDTC).  Any error is re-raised;
             XACT_ABORT ON dooms the caller's transaction.
Isolation:   sets READ COMMITTED itself (UPDLOCK, HOLDLOCK on the one row).
Lock order:  mailq.HookDispatcher (the row, U -> X), then delay.Task (read),
             then dbo.InitiateDelayExecution's (tabDIYTable12402, delay.Task).
Security:    granted to MailqAdmin; InitiateDelayExecution is reached by
             ownership chaining (both owned by dbo).
Example:     EXEC mailq.StartHookDispatcher @IntervalSeconds = 30;
             EXEC mailq.StartHookDispatcher @Enabled = 0;  -- stop
*/
CREATE OR ALTER PROCEDURE mailq.StartHookDispatcher
    @IntervalSeconds INT = 30,
    @Enabled BIT = 1
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE
        @Msg NVARCHAR(2048),
        @Generation BIGINT,
        @InstanceKey UNIQUEIDENTIFIER,
        @TaskID BIGINT,
        @WasEnabled BIT,
        @Key NVARCHAR(100),
        @Scheduled BIT = 0;
    DECLARE @NewTask TABLE (TaskID BIGINT);

    SET @IntervalSeconds = COALESCE(@IntervalSeconds, 30);
    SET @Enabled = COALESCE(@Enabled, 1);
    IF @IntervalSeconds NOT BETWEEN 1 AND 3600
    BEGIN
        SET @Msg = CONCAT(N'@IntervalSeconds must be 1-3600; got ', @IntervalSeconds, N'.');
        THROW 50295, @Msg, 1;
    END;

    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        -- UPDLOCK, HOLDLOCK: one starter at a time, also while the row is absent.
        SELECT
            @Generation = d.Generation,
            @InstanceKey = d.InstanceKey,
            @TaskID = d.TaskID,
            @WasEnabled = d.Enabled
        FROM mailq.HookDispatcher AS d WITH (UPDLOCK, HOLDLOCK)
        WHERE d.Singleton = 1;

        IF @Generation IS NULL
        BEGIN
            INSERT INTO mailq.HookDispatcher (Singleton, Enabled, IntervalSeconds, Generation)
            VALUES (1, 0, @IntervalSeconds, 0);
            SELECT
                @Generation = d.Generation,
                @InstanceKey = d.InstanceKey,
                @WasEnabled = 0
            FROM mailq.HookDispatcher AS d
            WHERE d.Singleton = 1;
        END;

        IF @Enabled = 0
            UPDATE d
            SET
                d.Enabled = 0,
                d.Generation = d.Generation + 1,
                d.IntervalSeconds = @IntervalSeconds,
                d.ChangedAtUtc = SYSUTCDATETIME(),
                d.ChangedBy = ORIGINAL_LOGIN()
            FROM mailq.HookDispatcher AS d
            WHERE d.Singleton = 1;
        ELSE IF @WasEnabled = 1 AND EXISTS (
            SELECT 1
            FROM delay.Task AS t
            WHERE t.TaskID = @TaskID AND t.TaskState IN (N'Scheduled', N'Running', N'Retrying')
        )
            -- A task of the current generation is pending: re-time only.
            UPDATE d
            SET
                d.IntervalSeconds = @IntervalSeconds,
                d.ChangedAtUtc = SYSUTCDATETIME(),
                d.ChangedBy = ORIGINAL_LOGIN()
            FROM mailq.HookDispatcher AS d
            WHERE d.Singleton = 1;
        ELSE
        BEGIN
            SET @Generation += 1;
            SET @Key = CONCAT(N'mailq.HookDispatcher:', @InstanceKey, N':', @Generation);
            -- InitiateDelayExecution's one-row result is kept here, not passed on.
            INSERT INTO @NewTask (TaskID)
            EXEC dbo.InitiateDelayExecution
                @F108211 = N'mailq.HookDispatcherTask',
                @F108218 = 0,
                @F108212 = @Generation,
                @F108210 = N'mailq hook dispatcher',
                @TaskID = @TaskID OUTPUT,
                @IdempotencyKey = @Key;
            UPDATE d
            SET
                d.Enabled = 1,
                d.Generation = @Generation,
                d.TaskID = @TaskID,
                d.IntervalSeconds = @IntervalSeconds,
                d.LastError = NULL,
                d.ChangedAtUtc = SYSUTCDATETIME(),
                d.ChangedBy = ORIGINAL_LOGIN()
            FROM mailq.HookDispatcher AS d
            WHERE d.Singleton = 1;
            SET @Scheduled = 1;
        END;

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        d.Enabled,
        d.IntervalSeconds,
        d.Generation,
        d.TaskID,
        t.TaskState,
        @Scheduled AS Scheduled
    FROM mailq.HookDispatcher AS d
    LEFT JOIN delay.Task AS t ON d.TaskID = t.TaskID
    WHERE d.Singleton = 1;
END;
