/*
delay.RecordOutcome: step 3 of dbo.ProcessDelayQueue, split out of it
(revision 0010): records the outcome of one run of a task's target in a new
transaction, retried on deadlock (1205) at most three times.  No RECEIVE
happens here, so a rollback never counts against the queue.
Parameters:  @TaskID BIGINT, @TaskHandle UNIQUEIDENTIFIER (the task's
             conversation), @TargetName NVARCHAR(400), @Attempt INT (the
             attempt step 1 started), @ErrorNumber INT / @ErrorMessage
             NVARCHAR(4000) (NULL: the target succeeded), @Retryable BIT
             (0: the target committed or rolled back the transaction opened
             for it; never run again), @Recorded BIT OUTPUT (1: committed)
Result set:  none.
Outcome:     still Running in this attempt -> Done (delay.FinishTask
             @SetReceipt = 0) | Retrying + backoff timer (retryable, attempts
             left, conversation open) | Failed (GaveUp).  Finished meanwhile
             (a broker Error) or the row is gone: that outcome is kept and a
             failure is only logged.  The receipt is written by the caller,
             after this COMMIT (never inside a transaction here).
Errors:      50360 called inside a transaction (internal misuse).  Any other
             error is caught: logged to delay.Log (best effort), @Recorded = 0;
             the lease timer (or delay.Reconcile) finds the task Running.
Transaction: opens and commits its own, one per try; must be called outside a
             transaction (the caller is the activation procedure, between
             step 2 and the receipt).
Isolation:   READ COMMITTED (set here): the UPDLOCK read locks the latest
             committed row.
Lock order:  the task's conversation group first (BEGIN CONVERSATION TIMER
             locks it; skipped when the endpoint is no longer open), then its
             delay.Task row (UPDLOCK, ROWLOCK), then delay.Log: the order of
             step 1, dbo.CancelDelayExecution and delay.Reconcile.
Internal:    called by dbo.ProcessDelayQueue only (both dbo's; ownership
             chaining); no role is granted EXECUTE.
Example:     EXEC delay.RecordOutcome @TaskID = 42, @TaskHandle = @h, @TargetName = N'dbo.P',
                 @Attempt = 1, @ErrorNumber = NULL, @ErrorMessage = NULL, @Retryable = 1,
                 @Recorded = @r OUTPUT;
*/
CREATE OR ALTER PROCEDURE delay.RecordOutcome
    @TaskID BIGINT,
    @TaskHandle UNIQUEIDENTIFIER,
    @TargetName NVARCHAR(400),
    @Attempt INT,
    @ErrorNumber INT,
    @ErrorMessage NVARCHAR(4000),
    @Retryable BIT,
    @Recorded BIT OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    -- The reader's own priority for its bookkeeping (the caller re-asserts
    -- it after the target too; a SET in a procedure reverts when it returns).
    SET DEADLOCK_PRIORITY HIGH;

    IF @@TRANCOUNT > 0
        THROW 50360, N'delay.RecordOutcome opens its own transaction; call it outside one (internal misuse).', 1;

    DECLARE
        @Now DATETIME2(3),
        @TaskState NVARCHAR(16),
        @Attempts INT,
        @Timeout INT,
        @Backoff BIGINT,
        @EndpointOpen BIT,
        @Try INT,
        @StepErrorNumber INT,
        @StepErrorMessage NVARCHAR(4000),
        @MaxAttempts INT = 3,
        @RetryBaseSeconds INT = 30,
        @RetryMaxSeconds INT = 3600,
        @LeaseSeconds INT = 600,
        -- A conversation timer never exceeds one day; longer ones are chained.
        @MaxTimerSeconds INT = 86400;

    SELECT
        @MaxAttempts = s.MaxAttempts,
        @RetryBaseSeconds = s.RetryBaseSeconds,
        @RetryMaxSeconds = s.RetryMaxSeconds,
        @LeaseSeconds = s.LeaseSeconds
    FROM delay.Setting AS s
    WHERE s.SettingId = 1;

    SELECT @Recorded = 0, @Try = 0;
    WHILE @Recorded = 0 AND @Try < 3
    BEGIN
        SET @Try += 1;
        BEGIN TRY
            BEGIN TRANSACTION;

            -- Conversation group first (BEGIN CONVERSATION TIMER locks
            -- it), then the task row: the lock order of step 1.  It
            -- also keeps the watchdog armed until the outcome is
            -- committed.  A conversation ended meanwhile (a recovery,
            -- NEW_BROKER) has no group to lock: the row comes first.
            SET @EndpointOpen = CASE
                WHEN EXISTS (
                    SELECT 1 FROM sys.conversation_endpoints AS e
                    WHERE e.conversation_handle = @TaskHandle AND e.state NOT IN ('CD', 'DO', 'ER', 'DI')
                ) THEN 1
                ELSE 0
            END;
            SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
            IF @EndpointOpen = 1
                BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

            SET @TaskState = NULL;
            -- UPDLOCK, ROWLOCK: as in step 1.
            SELECT
                @TaskState = t.TaskState,
                @Attempts = t.Attempts
            FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
            WHERE t.TaskID = @TaskID;

            SET @Now = SYSUTCDATETIME();

            IF @TaskState IS NULL OR @TaskState <> N'Running' OR @Attempts <> @Attempt
            BEGIN
                -- Finished meanwhile (a broker Error) or the row is gone: keep that outcome.
                IF @ErrorNumber IS NOT NULL
                    INSERT INTO delay.Log (
                        TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                    )
                    VALUES (
                        @TaskID, N'Failed', @TargetName, @Attempt, @ErrorNumber, @ErrorMessage, @TaskHandle
                    );
            END;
            ELSE IF @ErrorNumber IS NULL
                EXEC delay.FinishTask @SetReceipt = 0, @TaskID = @TaskID, @TaskState = N'Done';
            ELSE IF @Retryable = 1 AND @Attempt < @MaxAttempts AND @EndpointOpen = 1
            BEGIN
                SET @Backoff = CAST(@RetryBaseSeconds AS BIGINT)
                    * POWER(CAST(4 AS BIGINT), IIF(@Attempt > 10, 10, @Attempt - 1));
                SET @Timeout = CAST(IIF(@Backoff > @RetryMaxSeconds, @RetryMaxSeconds, @Backoff) AS INT);

                UPDATE delay.Task
                SET
                    TaskState = N'Retrying',
                    NextRunAtUtc = DATEADD(SECOND, @Timeout, @Now),
                    LeaseUntilUtc = NULL,
                    LastErrorNumber = @ErrorNumber,
                    LastErrorMessage = @ErrorMessage
                WHERE TaskID = @TaskID;

                -- Replaces the lease: the retry is a new timer on the same conversation.
                BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                INSERT INTO delay.Log (
                    TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                )
                VALUES (@TaskID, N'Failed', @TargetName, @Attempt, @ErrorNumber, @ErrorMessage, @TaskHandle);
            END;
            ELSE
                EXEC delay.FinishTask
                    @SetReceipt = 0,
                    @TaskID = @TaskID,
                    @TaskState = N'Failed',
                    @EventName = N'GaveUp',
                    @ErrorNumber = @ErrorNumber,
                    @ErrorMessage = @ErrorMessage;

            COMMIT TRANSACTION;
            SET @Recorded = 1;
        END TRY
        BEGIN CATCH
            SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;
            -- 1205: deadlock victim, try again.  Anything else: stop
            -- trying; the lease timer (or delay.Reconcile) finds the
            -- task Running with no runner.
            IF @StepErrorNumber <> 1205 OR @Try >= 3
            BEGIN
                SET @Try = 3;
                BEGIN TRY
                    INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage)
                    VALUES (
                        @TaskID, N'BrokerError', @TargetName, @Attempt, @StepErrorNumber,
                        CONCAT(
                            N'the outcome of attempt ', @Attempt, N' could not be recorded: ', @StepErrorMessage
                        )
                    );
                END TRY
                BEGIN CATCH
                    -- Best effort: the lease timer still covers the task.
                    SET @Recorded = 0;
                END CATCH;
            END;
        END CATCH;
    END;
END;
