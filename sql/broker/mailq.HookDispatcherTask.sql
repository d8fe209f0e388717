/*
mailq.HookDispatcherTask: the delayed-execution target that runs the hook
dispatcher and re-arms itself (docs/hooks.md, "With delayed execution").
Started by mailq.StartHookDispatcher; allow-listed (and pinned) by
broker/mailq.HookDispatcherTask.allow.sql at deployment.  Not for callers.
Parameters:  the target contract (docs/delayed-execution.md): @SPName,
             @Param1 ... @Param5 NVARCHAR(200); @Param1 = the generation this
             run was scheduled for (mailq.HookDispatcher.Generation); the
             others are ignored.
What it does, in dbo.ProcessDelayQueue's target transaction (the one
transaction opened for it, @@TRANCOUNT = 1 on entry):
  1. If the dispatcher is enabled and @Param1 is the current generation:
     schedule the next run (dbo.InitiateDelayExecution, delay =
     IntervalSeconds, idempotency key InstanceKey + next generation: a
     repeated re-arm returns the same task) and move the generation on.
     Otherwise (stopped, restarted, or this run delivered twice) do nothing:
     a stale run never forks the chain.
  2. COMMIT that transaction (the next run is now durable whatever happens
     below), run mailq.RunApplicationHooks outside any transaction (each
     hook call in its own; it refuses to run inside one), then BEGIN
     TRANSACTION again before returning: @@TRANCOUNT is 1 on return as on
     entry, so no 266 is raised ("if BEGIN TRANSACTION is executed after
     COMMIT TRANSACTION, the error does not occur", Rollbacks and commits in
     stored procedures and triggers,
     https://learn.microsoft.com/previous-versions/sql/sql-server-2008-r2/ms187844(v=sql.105)),
     and the processor commits the empty transaction and records Done.
     This is the one target that ends the transaction opened for it, on
     purpose: SQL Server has no autonomous transaction, and per-event
     transactions are what makes hooks poison-proof.  The second
     transaction holds only step 3's note, so the processor's commit or
     rollback of it decides nothing else.
  3. An error of the dispatcher's own bookkeeping is recorded in
     mailq.HookDispatcher.LastError and not re-raised (the chain is already
     re-armed; a re-raise would only make the processor retry a stale run).
Overlap: a run that starts while the previous one still runs finds
mailq.RunApplicationHooks' application lock held, returns 'Busy' at once,
and has re-armed already: slow hooks delay hooks, never the chain.
Result set:  none.
Errors:      50298 called with a transaction count other than 1 (not run by
             delayed execution).
Transaction: see above: commits the transaction opened for it and opens a
             new one before it returns.
Isolation:   sets READ COMMITTED itself (UPDLOCK on the dispatcher row).
Lock order:  mailq.HookDispatcher (the row, U -> X), then
             dbo.InitiateDelayExecution's (tabDIYTable12402, delay.Task);
             then, outside that transaction, mailq.RunApplicationHooks'.
Security:    run by dbo.ProcessDelayQueue as dbo; no role is granted EXECUTE.
Example:     (run by delayed execution only; start it with mailq.StartHookDispatcher)
*/
CREATE OR ALTER PROCEDURE mailq.HookDispatcherTask
    @SPName NVARCHAR(200) = NULL,
    @Param1 NVARCHAR(200) = NULL,
    @Param2 NVARCHAR(200) = NULL,
    @Param3 NVARCHAR(200) = NULL,
    @Param4 NVARCHAR(200) = NULL,
    @Param5 NVARCHAR(200) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    IF @@TRANCOUNT <> 1
        THROW 50298,
            N'mailq.HookDispatcherTask is run by delayed execution only; start it with mailq.StartHookDispatcher.',
            1;

    DECLARE
        @Generation BIGINT = TRY_CAST(@Param1 AS BIGINT),
        @Enabled BIT,
        @Current BIGINT,
        @IntervalSeconds INT,
        @InstanceKey UNIQUEIDENTIFIER,
        @Next BIGINT,
        @NextTaskID BIGINT,
        @Key NVARCHAR(100),
        @Run BIT = 0,
        @Error NVARCHAR(4000);
    DECLARE @Scheduled TABLE (TaskID BIGINT);

    -- 1. Re-arm (in the transaction opened for us).
    SELECT
        @Enabled = d.Enabled,
        @Current = d.Generation,
        @IntervalSeconds = d.IntervalSeconds,
        @InstanceKey = d.InstanceKey
    FROM mailq.HookDispatcher AS d WITH (UPDLOCK, ROWLOCK)
    WHERE d.Singleton = 1;

    IF @Enabled = 1 AND @Generation = @Current
    BEGIN
        SET @Next = @Current + 1;
        SET @Key = CONCAT(N'mailq.HookDispatcher:', @InstanceKey, N':', @Next);
        -- InitiateDelayExecution returns the task ID as a result set too:
        -- kept here (it uses no INSERT ... EXEC itself, so this nests).
        INSERT INTO @Scheduled (TaskID)
        EXEC dbo.InitiateDelayExecution
            @F108211 = N'mailq.HookDispatcherTask',
            @F108218 = @IntervalSeconds,
            @F108212 = @Next,
            @F108210 = N'mailq hook dispatcher',
            @TaskID = @NextTaskID OUTPUT,
            @IdempotencyKey = @Key;
        UPDATE d
        SET
            d.Generation = @Next,
            d.TaskID = @NextTaskID,
            d.LastRunAtUtc = SYSUTCDATETIME()
        FROM mailq.HookDispatcher AS d
        WHERE d.Singleton = 1;
        SET @Run = 1;
    END;

    IF @Run = 0 RETURN;

    -- 2. Step out of the transaction, run the hooks, step back in.
    COMMIT TRANSACTION;
    BEGIN TRY
        EXEC mailq.RunApplicationHooks @MaxEvents = 1000, @Quiet = 1;
    END TRY
    BEGIN CATCH
        SET @Error = LEFT(CONCAT(N'error ', ERROR_NUMBER(), N': ', ERROR_MESSAGE()), 4000);
        IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
    END CATCH;

    BEGIN TRANSACTION;
    -- 3. Note the outcome (in the transaction the processor commits).
    UPDATE d
    SET d.LastError = @Error
    FROM mailq.HookDispatcher AS d
    WHERE d.Singleton = 1;
END;
