/*
dbo.ProcessDelayQueue: the activation procedure of dbo.DelayServiceQueue (EXECUTE AS
OWNER, up to MAX_QUEUE_READERS copies).  A reader loops:
  1. one transaction: WAITFOR (RECEIVE TOP (1)) a dispatcher message (its timer, or
     another reader's MailqDelayRequest); EndDialog, Error or a foreign message ends
     its conversation; a DialogTimer re-arms the safety tick.  Nothing else runs in
     it, so nothing a task does can roll a RECEIVE back (five rollbacks in a row
     would disable the queue);
  2. delay.RunDueTasks: the hook run if due, then claim and run due tasks, each in
     its own transaction, as MailqRunner;
  3. delay.ArmDispatcher: the timer to the next due task, hook run or claim lease,
     or the safety tick (a new dispatcher conversation if it was lost);
  4. wait: to the next due time when it is near (milliseconds), 1 s while the timer
     could not be set (polling), or leave when nothing came, nothing ran and the
     timer is set.
A failure in 2-3 goes to the error log (activation logs a reader's RAISERROR) and the
loop goes on; a claimed task is claimed again after its lease.  Its session options
are set here (activation starts it with the database's defaults); each target gets
its own SET line (delay.RunTask).  Errors: none raised.
Example:     started by Service Broker; by hand (db_owner): EXEC dbo.ProcessDelayQueue;
*/
CREATE OR ALTER PROCEDURE dbo.ProcessDelayQueue
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET ANSI_WARNINGS, ANSI_PADDING, ARITHABORT, CONCAT_NULL_YIELDS_NULL ON;
    SET NUMERIC_ROUNDABORT, IMPLICIT_TRANSACTIONS OFF;   -- each BEGIN TRANSACTION below is a real one
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE
        @Handle UNIQUEIDENTIFIER, @Type SYSNAME, @WaitMs INT = 0, @ReceiveWaitMs INT = 5000, @Claimed INT,
        @Armed BIT, @NextDue DATETIME2(3), @UntilDueMs BIGINT, @Text NVARCHAR(2047), @Tick INT = 60;
    WHILE 1 = 1
    BEGIN
        SELECT @Handle = NULL, @Type = NULL, @Claimed = 0, @Armed = 0, @NextDue = NULL;
        SELECT @ReceiveWaitMs = s.ReceiveWaitMs, @Tick = s.TickSeconds FROM delay.Setting AS s WHERE s.SettingId = 1;
        -- 1. One message, and nothing else in its transaction.
        BEGIN TRANSACTION;
        WAITFOR (
            RECEIVE TOP (1) @Handle = conversation_handle, @Type = message_type_name FROM dbo.DelayServiceQueue
        ), TIMEOUT @WaitMs;
        IF @Handle IS NOT NULL
            AND @Type NOT IN (N'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer', N'MailqDelayRequest')
            END CONVERSATION @Handle;
        -- The safety tick, with the RECEIVE (a reader dying in its pass leaves a timer); it commits anyway.
        SET XACT_ABORT OFF;
        BEGIN TRY
            IF @Type = N'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer'
                BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Tick;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() = -1 ROLLBACK TRANSACTION;
        END CATCH;
        SET XACT_ABORT ON;
        IF @@TRANCOUNT > 0 COMMIT TRANSACTION;
        -- 2. Due tasks, each in its own transaction.
        BEGIN TRY
            EXEC delay.RunDueTasks @Claimed = @Claimed OUTPUT;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            SET @Text = CONCAT(N'mailq-db dbo.ProcessDelayQueue: error ', ERROR_NUMBER(), N': ', ERROR_MESSAGE());
            RAISERROR (N'%s', 10, 1, @Text);
        END CATCH;
        -- 3. The timer.
        BEGIN TRY
            IF @Claimed >= 0 EXEC delay.ArmDispatcher @Armed = @Armed OUTPUT, @NextDueUtc = @NextDue OUTPUT;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            SET @Text = CONCAT(N'mailq-db dbo.ProcessDelayQueue: timer error ', ERROR_NUMBER(), N': ', ERROR_MESSAGE());
            RAISERROR (N'%s', 10, 1, @Text);
        END CATCH;
        -- 4. The next wait.
        SET @UntilDueMs = DATEDIFF_BIG(MILLISECOND, SYSUTCDATETIME(), @NextDue);
        IF @Claimed < 0 BREAK;   -- a copy not enabled here: leave, the safety tick stays armed
        IF @Armed = 0
            SET @WaitMs = 1000;
        ELSE IF @UntilDueMs < @ReceiveWaitMs
            SET @WaitMs = IIF(@UntilDueMs < 1, 1, @UntilDueMs);
        ELSE IF @Handle IS NULL AND @Claimed = 0 BREAK;
        ELSE
            SET @WaitMs = @ReceiveWaitMs;
    END;
END;
