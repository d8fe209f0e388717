/*
dbo.ProcessDelayQueue: activation procedure of dbo.DelayServiceQueue; runs due
delayed tasks.  Service Broker starts it (EXECUTE AS OWNER, up to
MAX_QUEUE_READERS copies); it loops until the queue stays empty for
delay.Setting.ReceiveWaitMs, then returns.
Parameters:  none.  Result sets: none.
Messages:    DialogTimer (on a task's initiator handle): the delay, a retry's
                 backoff or the watchdog lease has expired
             MailqDelayRequest (on the target handle; body = task ID):
                 a task with delay 0, to run at once
             EndDialog, Error: end this side of the conversation; a task still
                 pending on it is failed (BrokerError)
Pattern:     DESIGN.md pattern (a), "receive, record, commit; then run":
             1. one transaction RECEIVEs one message, moves the task to Running,
                counts the attempt, sets the conversation timer to the lease
                (the watchdog) and COMMITs.  Only our own bookkeeping runs in a
                transaction that received a message, so no target can make it
                roll back.  (Service Broker disables a queue after five
                rollbacks in a row of transactions that received from it.)
             2. the target runs in a transaction of its own, through
                sp_executesql with the name built from catalog names
                (QUOTENAME) and every value passed as a parameter.  A target
                that throws or dooms its transaction (XACT_STATE() = -1) is
                rolled back; one that commits or rolls back our transaction
                itself raises 266 at its return (transaction count mismatch)
                and is failed without retry, because its work may already be
                committed; a slow one simply runs (nothing interrupts it).
             3. a new transaction records the outcome: Done (receipt 1, the
                conversation ends), or Retrying (a new conversation timer on the
                same conversation: backoff RetryBaseSeconds * 4^(n-1), capped at
                RetryMaxSeconds), or, after MaxAttempts runs, Failed (receipt 3,
                the conversation ends).
             Watchdog: while a task runs, its runner holds a session-owned
             application lock named for the task, taken in step 1 before its
             COMMIT (so no lease can expire between the commit and the lock).  When the lease timer fires
             and the lock is free, the runner is gone (its session ended
             mid-target): the attempt is failed (RunnerLost) and retried.  When
             the lock is held, the runner is alive and slow: the lease is
             extended and a Slow row is logged.
             Timers longer than one day are chained: a timer never exceeds
             86,400 s; when it fires early the task is re-armed for the rest.
             If our own bookkeeping fails, its transaction is rolled back once
             and the same message is received again in a fresh transaction
             that only records the failure and ends the conversation, so no
             message is ever rolled back twice by this procedure.
Locks:       every transaction here takes the conversation group first (RECEIVE,
             or BEGIN CONVERSATION TIMER in step 3), then the task row, the
             same order as dbo.CancelDelayExecution.  DEADLOCK_PRIORITY HIGH:
             in a deadlock with an application session, the application is
             the victim, not a transaction that received a message.
Errors:      none raised: failures go to delay.Log (docs/errors.md 503xx).
Example:     started by Service Broker; to drain by hand: EXEC dbo.ProcessDelayQueue;
*/
CREATE OR ALTER PROCEDURE dbo.ProcessDelayQueue
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET DEADLOCK_PRIORITY HIGH;

    DECLARE
        @Handle UNIQUEIDENTIFIER,
        @MessageType SYSNAME,
        @Body VARBINARY(MAX),
        @Now DATETIME2(3),
        @TaskID BIGINT,
        @TaskHandle UNIQUEIDENTIFIER,
        @TaskState NVARCHAR(16),
        @TargetName NVARCHAR(400),
        @NextRunAtUtc DATETIME2(3),
        @LeaseUntilUtc DATETIME2(3),
        @Attempts INT,
        @Attempt INT,
        @RemainingMs BIGINT,
        @Timeout INT,
        @Refusal INT,
        @RefusalMessage NVARCHAR(400),
        @SchemaName SYSNAME,
        @ProcedureName SYSNAME,
        @SPName NVARCHAR(200),
        @Param1 NVARCHAR(200),
        @Param2 NVARCHAR(200),
        @Param3 NVARCHAR(200),
        @Param4 NVARCHAR(200),
        @Param5 NVARCHAR(200),
        @Run BIT,
        @Retryable BIT,
        @Sql NVARCHAR(MAX),
        -- The target contract: (@SPName, @Param1 ... @Param5 NVARCHAR(200)).
        @ParameterList NVARCHAR(400) = CONCAT(
            N'@SPName NVARCHAR(200), @Param1 NVARCHAR(200), @Param2 NVARCHAR(200), ',
            N'@Param3 NVARCHAR(200), @Param4 NVARCHAR(200), @Param5 NVARCHAR(200)'
        ),
        @LockName NVARCHAR(255),
        @LockResult INT,
        @ErrorNumber INT,
        @ErrorMessage NVARCHAR(4000),
        @ErrorXml XML,
        @StepErrorNumber INT,
        @StepErrorMessage NVARCHAR(4000),
        @Backoff BIGINT,
        @Recorded BIT,
        @Try INT,
        @MaxAttempts INT,
        @RetryBaseSeconds INT,
        @RetryMaxSeconds INT,
        @LeaseSeconds INT,
        @ReceiveWaitMs INT;

    DECLARE
        @DialogTimer SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer',
        @EndDialog SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog',
        @BrokerError SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/Error',
        @DelayRequest SYSNAME = N'MailqDelayRequest',
        -- A conversation timer never exceeds one day; longer delays are chained.
        @MaxTimerSeconds INT = 86400,
        -- A timer that fires less than this before the due time counts as due
        -- (timers have whole-second resolution).
        @EarlyToleranceMs INT = 500;

    WHILE 1 = 1
    BEGIN
        SELECT
            @Handle = NULL,
            @MessageType = NULL,
            @Body = NULL,
            @TaskID = NULL,
            @TaskHandle = NULL,
            @TaskState = NULL,
            @Run = 0,
            @MaxAttempts = 3,
            @RetryBaseSeconds = 30,
            @RetryMaxSeconds = 3600,
            @LeaseSeconds = 600,
            @ReceiveWaitMs = 5000;

        SELECT
            @MaxAttempts = s.MaxAttempts,
            @RetryBaseSeconds = s.RetryBaseSeconds,
            @RetryMaxSeconds = s.RetryMaxSeconds,
            @LeaseSeconds = s.LeaseSeconds,
            @ReceiveWaitMs = s.ReceiveWaitMs
        FROM delay.Setting AS s
        WHERE s.SettingId = 1;

        ------------------------------------------------------------------
        -- 1. Receive one message and do the bookkeeping; commit.
        ------------------------------------------------------------------
        SELECT @LockResult = -1, @LockName = NULL;  -- no run lock held yet
        BEGIN TRY
            BEGIN TRANSACTION;

            -- WAITFOR (RECEIVE ...), TIMEOUT: waits up to @ReceiveWaitMs
            -- milliseconds for a message; no message means the reader exits.
            -- RECEIVE locks the message's conversation group until COMMIT.
            WAITFOR (
                RECEIVE TOP (1)
                    @Handle = conversation_handle,
                    @MessageType = message_type_name,
                    @Body = message_body
                FROM dbo.DelayServiceQueue
            ), TIMEOUT @ReceiveWaitMs;

            IF @Handle IS NULL
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            SET @Now = SYSUTCDATETIME();

            IF @MessageType = @DelayRequest
                SET @TaskID = CAST(@Body AS BIGINT);
            ELSE
                SELECT @TaskID = t.TaskID
                FROM delay.Task AS t
                WHERE t.ConversationHandle = @Handle;

            -- UPDLOCK: hold the row for this state transition, so a cancel or
            -- another reader cannot move the task between our read and write.
            -- ROWLOCK: one task, one row lock.
            SELECT
                @TaskState = t.TaskState,
                @TaskHandle = t.ConversationHandle,
                @TargetName = t.TargetName,
                @NextRunAtUtc = t.NextRunAtUtc,
                @LeaseUntilUtc = t.LeaseUntilUtc,
                @Attempts = t.Attempts
            FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
            WHERE t.TaskID = @TaskID;

            IF @MessageType IN (@EndDialog, @BrokerError)
            BEGIN
                IF @MessageType = @BrokerError
                BEGIN
                    -- The body of an Error message is
                    -- <Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error">
                    --   <Code>n</Code><Description>text</Description></Error>
                    -- (*: matches that namespace without declaring it.)
                    SET @ErrorXml = CAST(@Body AS XML);
                    SELECT
                        @ErrorNumber = @ErrorXml.value('(/*:Error/*:Code)[1]', 'INT'),
                        @ErrorMessage = @ErrorXml.value('(/*:Error/*:Description)[1]', 'NVARCHAR(4000)');
                END;
                ELSE
                    SELECT
                        @ErrorNumber = 50333,
                        @ErrorMessage = N'the conversation was ended by its other side before the task finished';

                IF @TaskState IN (N'Scheduled', N'Running', N'Retrying') AND @TaskHandle = @Handle
                    -- Ends @Handle, the task's own conversation.
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'BrokerError',
                        @ErrorNumber = @ErrorNumber,
                        @ErrorMessage = @ErrorMessage;
                ELSE
                    -- The target side of a delay-0 dialog, or a conversation
                    -- whose task is already final: just end this side.
                    END CONVERSATION @Handle;
            END;
            ELSE IF @MessageType NOT IN (@DialogTimer, @DelayRequest)
                -- Not ours (nothing else is in the contract): drop the conversation.
                END CONVERSATION @Handle;
            ELSE IF @TaskState IS NULL
                -- No task (it was replaced or never recorded): nothing to run.
                END CONVERSATION @Handle;
            ELSE IF @TaskState IN (N'Done', N'Failed', N'Refused', N'Cancelled')
            BEGIN
                -- Final already.  A late timer ends its conversation; a late
                -- DelayRequest leaves the target side to the EndDialog that
                -- the initiator side's END CONVERSATION sent.
                IF @MessageType = @DialogTimer
                    END CONVERSATION @Handle;
            END;
            ELSE IF @MessageType = @DelayRequest AND @TaskState <> N'Scheduled'
                -- A run already started through the task's own conversation.
                SET @Run = 0;
            ELSE IF @MessageType = @DialogTimer AND @TaskState = N'Running'
            BEGIN
                SET @RemainingMs = DATEDIFF_BIG(MILLISECOND, @Now, @LeaseUntilUtc);
                IF @RemainingMs > @EarlyToleranceMs
                BEGIN
                    -- Early (chained or re-armed timer): wait for the rest of the lease.
                    SET @Timeout = CASE
                        WHEN @RemainingMs >= CAST(@MaxTimerSeconds AS BIGINT) * 1000 THEN @MaxTimerSeconds
                        ELSE CAST((@RemainingMs + 999) / 1000 AS INT)
                    END;
                    BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
                END;
                ELSE
                BEGIN
                    -- The lease expired: is the runner alive?  It holds this
                    -- session-owned lock for as long as the target runs; a
                    -- session that ended released it.
                    SET @LockName = CONCAT(N'mailq-db/delay/task/', @TaskID);
                    EXEC @LockResult = sys.sp_getapplock
                        @Resource = @LockName,
                        @LockMode = N'Exclusive',
                        @LockOwner = N'Session',
                        @LockTimeout = 0;

                    IF @LockResult < 0
                    BEGIN
                        -- Alive and slow: extend the lease, never interrupt.
                        UPDATE delay.Task
                        SET LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now)
                        WHERE TaskID = @TaskID;

                        SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;

                        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorMessage, ConversationHandle)
                        VALUES (
                            @TaskID, N'Slow', @TargetName, @Attempts,
                            CONCAT(N'attempt ', @Attempts, N' still running after its lease; lease extended by ',
                                @LeaseSeconds, N' s'),
                            @Handle
                        );
                    END;
                    ELSE
                    BEGIN
                        EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';

                        SET @ErrorMessage = CONCAT(
                            N'attempt ', @Attempts, N' ended without reporting: its session ended while the target ran'
                        );
                        IF @Attempts < @MaxAttempts
                        BEGIN
                            SET @Backoff = CAST(@RetryBaseSeconds AS BIGINT)
                                * POWER(CAST(4 AS BIGINT), IIF(@Attempts > 10, 10, @Attempts - 1));
                            SET @Timeout = CAST(IIF(@Backoff > @RetryMaxSeconds, @RetryMaxSeconds, @Backoff) AS INT);

                            UPDATE delay.Task
                            SET
                                TaskState = N'Retrying',
                                NextRunAtUtc = DATEADD(SECOND, @Timeout, @Now),
                                LeaseUntilUtc = NULL,
                                LastErrorNumber = 50331,
                                LastErrorMessage = @ErrorMessage
                            WHERE TaskID = @TaskID;

                            BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;

                            INSERT INTO delay.Log (
                                TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                            )
                            VALUES (@TaskID, N'RunnerLost', @TargetName, @Attempts, 50331, @ErrorMessage, @Handle);
                        END;
                        ELSE
                            EXEC delay.FinishTask
                                @TaskID = @TaskID,
                                @TaskState = N'Failed',
                                @EventName = N'RunnerLost',
                                @ErrorNumber = 50331,
                                @ErrorMessage = @ErrorMessage;
                    END;
                END;
            END;
            ELSE
            BEGIN
                -- Scheduled or Retrying, on its timer or its DelayRequest.
                SET @RemainingMs = DATEDIFF_BIG(MILLISECOND, @Now, @NextRunAtUtc);
                IF @MessageType = @DialogTimer AND @RemainingMs > @EarlyToleranceMs
                BEGIN
                    -- A chained timer of a delay longer than one day: re-arm for the rest.
                    SET @Timeout = CASE
                        WHEN @RemainingMs >= CAST(@MaxTimerSeconds AS BIGINT) * 1000 THEN @MaxTimerSeconds
                        ELSE CAST((@RemainingMs + 999) / 1000 AS INT)
                    END;
                    BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
                END;
                ELSE
                BEGIN
                    -- Due.  Resolve the name again: the allow-list or the
                    -- procedure may have changed since the row was scheduled.
                    SELECT
                        @Refusal = r.RefusalNumber,
                        @RefusalMessage = r.RefusalMessage,
                        @SchemaName = r.SchemaName,
                        @ProcedureName = r.ProcedureName
                    FROM delay.ResolveTarget(@TargetName) AS r;

                    IF @Refusal IS NOT NULL
                        EXEC delay.FinishTask
                            @TaskID = @TaskID,
                            @TaskState = N'Refused',
                            @EventName = N'Refused',
                            @ErrorNumber = @Refusal,
                            @ErrorMessage = @RefusalMessage;
                    ELSE
                    BEGIN
                        -- The values are read at run time, by the row's ID.
                        SELECT
                            @SPName = CAST(p.F108211 AS NVARCHAR(200)),
                            @Param1 = CAST(p.F108212 AS NVARCHAR(200)),
                            @Param2 = CAST(p.F108213 AS NVARCHAR(200)),
                            @Param3 = CAST(p.F108214 AS NVARCHAR(200)),
                            @Param4 = CAST(p.F108215 AS NVARCHAR(200)),
                            @Param5 = CAST(p.F108216 AS NVARCHAR(200))
                        FROM dbo.tabDIYTable12402 AS p
                        WHERE p.ID = @TaskID;

                        IF @@ROWCOUNT = 0
                            EXEC delay.FinishTask
                                @TaskID = @TaskID,
                                @TaskState = N'Cancelled',
                                @EventName = N'Cancelled',
                                @ErrorNumber = 50332,
                                @ErrorMessage = N'the platform row was deleted before the task ran';
                        ELSE
                        BEGIN
                            -- The run lock is taken here, before this
                            -- transaction commits the task as Running: a
                            -- watchdog that fires between that commit and the
                            -- target must find it held, or it would declare the
                            -- runner lost and start a second run (spin found
                            -- that race: models/delayexec.pml, delay-stale-runner).
                            -- Session-owned, so the COMMIT below keeps it;
                            -- released after step 3, or by the session's end.
                            SET @LockName = CONCAT(N'mailq-db/delay/task/', @TaskID);
                            EXEC @LockResult = sys.sp_getapplock
                                @Resource = @LockName,
                                @LockMode = N'Exclusive',
                                @LockOwner = N'Session',
                                @LockTimeout = 0;
                        END;

                        IF @LockResult < 0 AND @LockName IS NOT NULL
                        BEGIN
                            -- A runner of an earlier attempt still holds the
                            -- task: never run it twice at once.  Wait a lease.
                            SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                            BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                            INSERT INTO delay.Log (
                                TaskID, EventName, TargetName, Attempt, ErrorMessage, ConversationHandle
                            )
                            VALUES (
                                @TaskID, N'Slow', @TargetName, @Attempts,
                                N'an earlier run of this task still holds its run lock; '
                                + N'the next attempt waits a lease',
                                @Handle
                            );
                        END;
                        ELSE IF @LockName IS NOT NULL
                        BEGIN
                            SET @Attempt = @Attempts + 1;

                            UPDATE delay.Task
                            SET
                                TaskState = N'Running',
                                Attempts = @Attempt,
                                SchemaName = @SchemaName,
                                ProcedureName = @ProcedureName,
                                FirstStartedAtUtc = ISNULL(FirstStartedAtUtc, @Now),
                                LastStartedAtUtc = @Now,
                                NextRunAtUtc = NULL,
                                LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now)
                            WHERE TaskID = @TaskID;

                            -- The watchdog: on the task's own conversation
                            -- (for a DelayRequest, @Handle is the target side).
                            SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                            BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                            SET @Run = 1;
                        END;
                    END;
                END;
            END;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            SELECT @ErrorNumber = ERROR_NUMBER(), @ErrorMessage = ERROR_MESSAGE();
            -- The message goes back to the queue: one rollback of it.
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;
            -- A run lock taken in this step survives the rollback (it is
            -- session-owned): give it back, the task was not started.
            IF @LockResult >= 0 AND @LockName IS NOT NULL
                EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';
            SET @LockResult = -1;

            -- Nothing received (the queue itself failed, e.g. disabled): stop;
            -- activation starts a reader again when the queue works.
            IF @Handle IS NULL
                RETURN;

            -- Receive that message again in a fresh transaction that only
            -- records the failure and ends the conversation, so it is never
            -- rolled back a second time in a row by a retry of the same bug.
            BEGIN TRY
                BEGIN TRANSACTION;

                RECEIVE TOP (1) @Body = message_body
                FROM dbo.DelayServiceQueue
                WHERE conversation_handle = @Handle;

                SET @ErrorMessage = CONCAT(
                    N'dbo.ProcessDelayQueue failed on a ', @MessageType, N' message: ', @ErrorMessage
                );

                IF @TaskID IS NOT NULL AND EXISTS (
                    SELECT 1 FROM delay.Task AS t
                    WHERE t.TaskID = @TaskID AND t.TaskState IN (N'Scheduled', N'Running', N'Retrying')
                )
                BEGIN
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'BrokerError',
                        @ErrorNumber = @ErrorNumber,
                        @ErrorMessage = @ErrorMessage;
                    -- For a DelayRequest, @Handle is the target side; it ends
                    -- when the EndDialog that FinishTask caused arrives.
                END;
                ELSE
                BEGIN
                    INSERT INTO delay.Log (TaskID, EventName, ErrorNumber, ErrorMessage, ConversationHandle)
                    VALUES (@TaskID, N'BrokerError', @ErrorNumber, @ErrorMessage, @Handle);
                    END CONVERSATION @Handle;
                END;

                COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- Twice in a row: stop this reader rather than spin.  The
                -- message stays on the queue for a later reader.
                RETURN;
            END CATCH;

            SET @Run = 0;
        END CATCH;

        IF @Run = 0
            CONTINUE;

        ------------------------------------------------------------------
        -- 2. Run the target in its own transaction.
        ------------------------------------------------------------------
        -- This session holds the task's run lock since step 1 (session-owned:
        -- it survives the target's COMMIT or ROLLBACK; released below, or by
        -- the end of this session if it dies mid-target).
        SELECT @ErrorNumber = NULL, @ErrorMessage = NULL, @Retryable = 1;

        BEGIN
            -- Built from the catalog's names (delay.ResolveTarget checked the
            -- allow-list and the object's identity), each part QUOTENAMEd;
            -- the six values are parameters, never part of the text.
            SET @Sql = CONCAT(
                N'EXEC ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@ProcedureName),
                N' @SPName = @SPName, @Param1 = @Param1, @Param2 = @Param2,',
                N' @Param3 = @Param3, @Param4 = @Param4, @Param5 = @Param5;'
            );

            BEGIN TRY
                BEGIN TRANSACTION;

                EXEC sys.sp_executesql
                    @Sql,
                    @ParameterList,
                    @SPName = @SPName,
                    @Param1 = @Param1,
                    @Param2 = @Param2,
                    @Param3 = @Param3,
                    @Param4 = @Param4,
                    @Param5 = @Param5;

                IF @@TRANCOUNT > 1
                BEGIN
                    -- Left a transaction of its own open (normally 266 is raised first).
                    SELECT
                        @ErrorNumber = 50335,
                        @ErrorMessage = CONCAT(N'the target left ', @@TRANCOUNT - 1, N' transaction(s) open');
                    ROLLBACK TRANSACTION;
                END;
                ELSE IF @@TRANCOUNT = 1
                    COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                SELECT @ErrorNumber = ERROR_NUMBER(), @ErrorMessage = ERROR_MESSAGE();
                -- Doomed (-1) or not (1): the target's work is undone as a whole.
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- 266: the target committed or rolled back the transaction
                -- opened for it; what it did may be committed, so it is not
                -- run again.
                IF @ErrorNumber = 266
                    SELECT
                        @Retryable = 0,
                        @ErrorMessage = CONCAT(
                            N'the target committed or rolled back the transaction opened for it ',
                            N'(its work may be committed; not retried): ', @ErrorMessage
                        );
            END CATCH;
        END;

        ------------------------------------------------------------------
        -- 3. Record the outcome in a new transaction (retried on deadlock).
        ------------------------------------------------------------------
        SELECT @Recorded = 0, @Try = 0;
        WHILE @Recorded = 0 AND @Try < 3
        BEGIN
            SET @Try += 1;
            BEGIN TRY
                BEGIN TRANSACTION;

                -- Conversation group first (BEGIN CONVERSATION TIMER locks it),
                -- then the task row: the lock order of step 1.  It also keeps
                -- the watchdog armed until the outcome is committed.
                SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
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
                        VALUES (@TaskID, N'Failed', @TargetName, @Attempt, @ErrorNumber, @ErrorMessage, @TaskHandle);
                END;
                ELSE IF @ErrorNumber IS NULL
                    EXEC delay.FinishTask @TaskID = @TaskID, @TaskState = N'Done';
                ELSE IF @Retryable = 1 AND @Attempt < @MaxAttempts
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
                -- 1205: deadlock victim, try again.  Anything else (e.g. the
                -- conversation was ended by a broker Error meanwhile): stop
                -- trying; the task's state already says what happened, or the
                -- lease timer will find it Running with no runner.
                IF @StepErrorNumber <> 1205 OR @Try >= 3
                BEGIN
                    SET @Try = 3;
                    BEGIN TRY
                        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage)
                        VALUES (
                            @TaskID, N'BrokerError', @TargetName, @Attempt, @StepErrorNumber,
                            CONCAT(N'the outcome of attempt ', @Attempt, N' could not be recorded: ', @StepErrorMessage)
                        );
                    END TRY
                    BEGIN CATCH
                        -- Best effort: the lease timer still covers the task.
                        SET @Recorded = 0;
                    END CATCH;
                END;
            END CATCH;
        END;

        IF @LockResult >= 0
            EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';
    END;
END;
