/*
mailq.StartHookDispatcher: starts, re-times or stops the hook dispatcher of delayed
execution (docs/hooks.md): a reader runs mailq.RunApplicationHooks every
@IntervalSeconds.  Starting sets the first run to now and arms the dispatcher's
timer; starting again only re-times it; stopping sets Enabled = 0.
Parameters:  @IntervalSeconds INT = 30 (1-3600); @Enabled BIT = 1 (0: stop)
Result set:  one row: Enabled, IntervalSeconds, NextRunAtUtc, LastRunAtUtc, LastError
Errors:      50295 @IntervalSeconds outside 1-3600
Transaction: its own or the caller's; any error dooms either and is re-raised.  Isolation: READ COMMITTED.
Lock order:  mailq.HookDispatcher, then delay.ArmDispatcher's.
Security:    granted to MailqAdmin.
Example:     EXEC mailq.StartHookDispatcher @IntervalSeconds = 30;
*/
CREATE OR ALTER PROCEDURE mailq.StartHookDispatcher
    @IntervalSeconds INT = 30,
    @Enabled BIT = 1
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048), @Now DATETIME2(3) = SYSUTCDATETIME();
    SELECT @IntervalSeconds = COALESCE(@IntervalSeconds, 30), @Enabled = COALESCE(@Enabled, 1);
    IF @IntervalSeconds NOT BETWEEN 1 AND 3600
    BEGIN
        SET @Msg = CONCAT(N'@IntervalSeconds must be 1-3600; got ', @IntervalSeconds, N'.');
        THROW 50295, @Msg, 1;
    END;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK, HOLDLOCK: update-else-insert of the one row without a race.
        UPDATE h
        SET
            h.Enabled = @Enabled, h.NextRunAtUtc = IIF(@Enabled = 1 AND h.Enabled = 0, @Now, h.NextRunAtUtc),
            h.IntervalSeconds = @IntervalSeconds, h.ChangedAtUtc = @Now, h.ChangedBy = ORIGINAL_LOGIN()
        FROM mailq.HookDispatcher AS h WITH (UPDLOCK, HOLDLOCK)
        WHERE h.Singleton = 1;
        IF @@ROWCOUNT = 0
            INSERT INTO mailq.HookDispatcher (Singleton, Enabled, IntervalSeconds, NextRunAtUtc)
            VALUES (1, @Enabled, @IntervalSeconds, @Now);
        IF @Enabled = 1
            EXEC delay.ArmDispatcher @DueAtUtc = @Now;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT h.Enabled, h.IntervalSeconds, h.NextRunAtUtc, h.LastRunAtUtc, h.LastError
    FROM mailq.HookDispatcher AS h WHERE h.Singleton = 1;
END;
