/*
dbo.ProcessDelayQueue: activation procedure of dbo.DelayServiceQueue; runs due
delayed tasks.  Service Broker starts it (EXECUTE AS OWNER, up to
MAX_QUEUE_READERS copies); it loops until the queue stays empty for
delay.Setting.ReceiveWaitMs, then returns.
Parameters:  none.  Result sets: none.
Messages:    DialogTimer (on a task's initiator handle): the delay, a retry's
                 backoff or the watchdog lease has expired
             MailqDelayRequest (on the target handle; body = task ID):
                 a task with delay 0, to run at once; it runs only if the task
                 is still bound to this very conversation (the initiator
                 handle of the same conversation_id), never by the ID alone
             EndDialog, Error: end this side of the conversation; a task still
                 pending on it is failed (BrokerError)

One pass of the loop, with its transaction boundaries and lock order:

  +-- STEP 1 (tran A) ---------------------------------------------------+
  | WAITFOR (RECEIVE TOP (1)) ......... locks the message's conversation  |
  |                                     group G(msg)                      |
  | [DelayRequest only] sp_getapplock cancel lock (Transaction), then     |
  |   BEGIN CONVERSATION TIMER (task's initiator handle) . locks G(task)  |
  | SELECT delay.Task WITH (UPDLOCK, ROWLOCK) ....... locks the task row  |
  | due -> sp_getapplock run lock (Session) .. a lock outside the tran    |
  |        Running, attempt + 1, lease timer                              |
  | final -> delay.Task and END CONVERSATION only (FinishTask @SetReceipt |
  |        = 0): never the platform's table inside a RECEIVE transaction  |
  | COMMIT                                                                |
  +-----------------------------------------------------------------------+
     | failed: ROLLBACK (the message is back on the queue: 1 rollback)
     |   1205, first time for this message in this reader: nothing else;
     |         the next RECEIVE redelivers it (one ordinary redelivery)
     |   otherwise -> RECOVERY
  +-- RECOVERY (tran R; runs only after a failed step 1) ----------------+
  | RECEIVE TOP (1) ... WHERE conversation_handle = @Handle               |
  | nothing received (another reader took it): COMMIT, go on              |
  | else INSERT delay.Incident (no CHECK, no trigger, no FK), END         |
  | CONVERSATION @Handle, COMMIT.  Nothing else: never delay.FinishTask,  |
  | never the platform's table (whose constraints or triggers we do not   |
  | own).  If tran R fails too: ROLLBACK (2nd rollback), RAISERROR to the |
  | error log, the reader stops.                                          |
  +-----------------------------------------------------------------------+
  +-- RECOVERY FOLLOW-UP (tran F, no RECEIVE) ---------------------------+
  | a Scheduled/Retrying task whose conversation tran R ended: FinishTask |
  | 'Failed' (50346).  Its failure can never count against the queue; it  |
  | is logged and left to delay.Reconcile.                                |
  +-----------------------------------------------------------------------+
  +-- STEP 2 (tran T, the target's) -------------------------------------+
  | sp_executesql: SET DEADLOCK_PRIORITY NORMAL; SET XACT_ABORT OFF;      |
  | SET LOCK_TIMEOUT n; EXEC [schema].[proc] @SPName = @SPName, ...       |
  | (SET options set in the dynamic batch revert when it returns; the     |
  | reader re-asserts its own after it anyway)                            |
  +-----------------------------------------------------------------------+
  +-- STEP 3 (tran B) ---------------------------------------------------+
  | BEGIN CONVERSATION TIMER (task handle, if the endpoint still exists)  |
  |                                 ... locks G(task)                     |
  | SELECT delay.Task WITH (UPDLOCK, ROWLOCK) ....... locks the task row  |
  | Done | Retrying (+ backoff timer) | Failed (GaveUp); COMMIT           |
  | (1205: tried again, at most 3 times)                                  |
  +-----------------------------------------------------------------------+
  RECEIPT (autocommit UPDATE, no transaction of ours): F108219 of a task
  that step 1 or step 3 made final (FinishTask @SetReceipt = 0 in both);
  a failure is logged, delay.Reconcile repairs it.
  RELEASE: the run lock, if this pass holds it, exactly once (one call
  site, guarded by @LockHeld, which it clears first).

Lock order:  the task's conversation group first, then its delay.Task row,
             then dbo.tabDIYTable12402 (delay.FinishTask, the receipt) - the
             same in dbo.CancelDelayExecution, delay.Reconcile and every
             transaction here.  A delay-0 request and a cancel both take the
             task's cancel lock (an application lock) before its group.  For a DelayRequest the
target side's group comes first (RECEIVE), and no other procedure ever takes
that group, so it cannot close a cycle.
Pattern:     DESIGN.md pattern (a), "receive, record, commit; then run": only
             our own bookkeeping runs in a transaction that received a
             message, so no target can make it roll back.  (Service Broker
             disables a queue after five rollbacks in a row of transactions
             that received from it:
             https://learn.microsoft.com/en-us/sql/database-engine/service-broker/removing-poison-messages)
             A failing step 1 costs at most two rollbacks of one message in
             this reader (1205: three), then the message is gone.
Watchdog:    while a task runs, its runner holds a session-owned application
             lock named for the task, taken in step 1 before its COMMIT.  When
             the lease timer fires, APPLOCK_TEST tells whether the runner is
             alive (slow: the lease is extended, a Slow row logged) or gone
             (RunnerLost: the attempt failed, retried or given up).
             Timers longer than one day are chained (86,400 s each).
Settings:    the reader runs DEADLOCK_PRIORITY HIGH and XACT_ABORT ON for its
             own bookkeeping; the target runs NORMAL, XACT_ABORT OFF and, if
             delay.Setting.TargetLockTimeoutMs is set, that LOCK_TIMEOUT.  A
             target is called inside the reader's TRY block: an error in it
             ends it and is caught here (T-SQL TRY...CATCH semantics), so a
             target that wants to handle its own errors uses TRY...CATCH.
Errors:      none raised, except the RAISERROR of a failed recovery or a
             disabled queue (it goes to the SQL Server error log: activation
             writes a reader's messages there).  Failures go to delay.Log and
             delay.Incident (docs/errors.md 503xx).
Example:     started by Service Broker; to drain by hand: EXEC dbo.ProcessDelayQueue;
*/
CREATE OR ALTER PROCEDURE dbo.ProcessDelayQueue
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- The UPDLOCK reads below must lock the latest committed row: READ COMMITTED
    -- whatever the caller runs under (a level set in a procedure reverts when it
    -- returns; under RCSI an UPDLOCK read still takes and honours locks).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SET DEADLOCK_PRIORITY HIGH;

    DECLARE
        @Handle UNIQUEIDENTIFIER,
        @MessageType SYSNAME,
        @Body VARBINARY(MAX),
        @Now DATETIME2(3),
        @TaskID BIGINT,
        @TaskHandle UNIQUEIDENTIFIER,
        @BoundHandle UNIQUEIDENTIFIER,
        @Unbound BIT,
        @LogText NVARCHAR(2047),
        @InitiatorHandle UNIQUEIDENTIFIER,
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
        @TooLong BIT,
        @Run BIT,
        @Retryable BIT,
        @Stop BIT = 0,
        @Recover BIT,
        @Recovered BIT,
        @Step1Committed BIT,
        @RedeliveredHandle UNIQUEIDENTIFIER,
        @EndpointOpen BIT,
        @Sql NVARCHAR(MAX),
        -- The target contract: (@SPName, @Param1 ... @Param5 NVARCHAR(200)).
        @ParameterList NVARCHAR(400) = CONCAT(
            N'@SPName NVARCHAR(200), @Param1 NVARCHAR(200), @Param2 NVARCHAR(200), ',
            N'@Param3 NVARCHAR(200), @Param4 NVARCHAR(200), @Param5 NVARCHAR(200)'
        ),
        @LockName NVARCHAR(255),
        @LockResult INT,
        @LockHeld BIT = 0,
        @CancelLockName NVARCHAR(255),
        @ErrorNumber INT,
        @ErrorMessage NVARCHAR(4000),
        @ErrorXml XML,
        @StepErrorNumber INT,
        @StepErrorMessage NVARCHAR(4000),
        @TargetTranCount INT,
        @Backoff BIGINT,
        @Recorded BIT,
        @Try INT,
        @MaxAttempts INT,
        @RetryBaseSeconds INT,
        @RetryMaxSeconds INT,
        @LeaseSeconds INT,
        @ReceiveWaitMs INT,
        @TargetLockTimeoutMs INT;

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

    WHILE @Stop = 0
    BEGIN
        SELECT
            @Handle = NULL,
            @MessageType = NULL,
            @Body = NULL,
            @TaskID = NULL,
            @TaskHandle = NULL,
            @BoundHandle = NULL,
            @Unbound = 0,
            @InitiatorHandle = NULL,
            @TaskState = NULL,
            @Run = 0,
            @Recover = 0,
            @Recovered = 0,
            @Step1Committed = 0,
            @Recorded = 0,
            @LockName = NULL,
            @MaxAttempts = 3,
            @RetryBaseSeconds = 30,
            @RetryMaxSeconds = 3600,
            @LeaseSeconds = 600,
            @ReceiveWaitMs = 5000,
            @TargetLockTimeoutMs = NULL;

        SELECT
            @MaxAttempts = s.MaxAttempts,
            @RetryBaseSeconds = s.RetryBaseSeconds,
            @RetryMaxSeconds = s.RetryMaxSeconds,
            @LeaseSeconds = s.LeaseSeconds,
            @ReceiveWaitMs = s.ReceiveWaitMs,
            @TargetLockTimeoutMs = s.TargetLockTimeoutMs
        FROM delay.Setting AS s
        WHERE s.SettingId = 1;

        --==================================================================
        -- STEP 1: receive one message and do the bookkeeping; commit.
        --==================================================================
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
                SET @Stop = 1;
            ELSE
            BEGIN
                SET @Now = SYSUTCDATETIME();

                IF @MessageType = @DelayRequest
                BEGIN
                    SET @TaskID = CAST(@Body AS BIGINT);
                    -- The request arrived on the target side of the task's
                    -- dialog; both sides share one conversation_id.  The
                    -- initiator side is the handle the task must be bound to
                    -- (a task ID alone may have been reused after the platform
                    -- truncated its table).
                    SELECT @InitiatorHandle = i.conversation_handle
                    FROM sys.conversation_endpoints AS t
                    INNER JOIN sys.conversation_endpoints AS i
                        ON t.conversation_id = i.conversation_id AND i.is_initiator = 1
                    WHERE t.conversation_handle = @Handle AND t.is_initiator = 0;

                    -- No lock yet: the conversation group comes before the row.
                    SELECT @BoundHandle = t.ConversationHandle
                    FROM delay.Task AS t
                    WHERE t.TaskID = @TaskID;

                    IF @BoundHandle IS NULL OR @InitiatorHandle IS NULL OR @BoundHandle <> @InitiatorHandle
                        -- Not bound to this conversation: never run.  (Both
                        -- known and different: the ID was reused; logged below.)
                        SELECT
                            @Unbound = IIF(@BoundHandle IS NOT NULL AND @InitiatorHandle IS NOT NULL, 1, 0),
                            @TaskID = NULL;
                    ELSE
                    BEGIN
                        -- The task's cancel lock (transaction-owned), taken by
                        -- delay.CancelTask first too: once we hold it, a cancel
                        -- has either committed (its conversation is closed and
                        -- the check below sees it) or not started, so the
                        -- timer below never meets a conversation that a cancel
                        -- ends while we wait for its group.
                        SET @LockResult = NULL;
                        SET @CancelLockName = CONCAT(N'mailq-db/delay/cancel/', @TaskID);
                        EXEC @LockResult = sys.sp_getapplock
                            @Resource = @CancelLockName,
                            @LockMode = N'Exclusive',
                            @LockOwner = N'Transaction',
                            @LockTimeout = -1;
                        IF @LockResult < 0
                            -- Chosen as a deadlock victim (-3) or cancelled:
                            -- transient, treated like 1205 below.
                            THROW 50350, N'the task''s cancel lock was not granted; the request is redelivered', 1;
                    END;

                    IF @TaskID IS NOT NULL AND EXISTS (
                        SELECT 1 FROM sys.conversation_endpoints AS e
                        WHERE e.conversation_handle = @BoundHandle AND e.state NOT IN ('CD', 'ER', 'DI')
                    )
                    BEGIN
                        -- Lock order: the task's conversation group before its
                        -- row, as everywhere (BEGIN CONVERSATION TIMER locks
                        -- the group).  The timer is the lease of the run about
                        -- to start; if the task is not run, a spare timer
                        -- fires later and finds nothing to do.
                        SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                        BEGIN CONVERSATION TIMER (@BoundHandle) TIMEOUT = @Timeout;
                    END;
                    -- else: bound, but its conversation is ending (the task is
                    -- final): the final-state branch below leaves it alone.
                END;
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

                ------------------------------------------------------------
                -- 1a. EndDialog / Error
                ------------------------------------------------------------
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
                            @SetReceipt = 0,
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
                ------------------------------------------------------------
                -- 1b. Messages with nothing to run
                ------------------------------------------------------------
                ELSE IF @MessageType NOT IN (@DialogTimer, @DelayRequest)
                    -- Not ours (nothing else is in the contract): drop the conversation.
                    END CONVERSATION @Handle;
                ELSE IF @TaskState IS NULL
                BEGIN
                    -- No task bound to this conversation (replaced, never
                    -- recorded, or a request whose ID now names another
                    -- task): nothing to run.
                    IF @Unbound = 1
                        INSERT INTO delay.Log (TaskID, EventName, ErrorNumber, ErrorMessage, ConversationHandle)
                        VALUES (
                            CAST(@Body AS BIGINT), N'BrokerError', 50347,
                            N'a delay-0 request arrived on a conversation the task is not bound to; not run',
                            @Handle
                        );
                    END CONVERSATION @Handle;
                END;
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
                ------------------------------------------------------------
                -- 1c. The watchdog: a lease timer of a Running task
                ------------------------------------------------------------
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
                    -- Is the runner alive?  It holds this session-owned lock for
                    -- as long as the target runs; a session that ended released
                    -- it.  APPLOCK_TEST only tests (1: grantable = free), so
                    -- there is nothing to release here.
                    ELSE IF APPLOCK_TEST(
                            N'public', CONCAT(N'mailq-db/delay/task/', @TaskID), N'Exclusive', N'Session'
                        ) = 0
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
                                @SetReceipt = 0,
                                @TaskID = @TaskID,
                                @TaskState = N'Failed',
                                @EventName = N'RunnerLost',
                                @ErrorNumber = 50331,
                                @ErrorMessage = @ErrorMessage;
                    END;
                END;
                ------------------------------------------------------------
                -- 1d. Scheduled or Retrying, on its timer or its DelayRequest
                ------------------------------------------------------------
                ELSE
                BEGIN
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
                        -- procedure (its definition included) may have changed
                        -- since the row was scheduled.
                        SELECT
                            @Refusal = r.RefusalNumber,
                            @RefusalMessage = r.RefusalMessage,
                            @SchemaName = r.SchemaName,
                            @ProcedureName = r.ProcedureName
                        FROM delay.ResolveTarget(@TargetName) AS r;

                        -- The values are read at run time, by the row's ID.
                        -- A value longer than the contract's 200 characters
                        -- is refused, never cut (an adopted table may have
                        -- wider columns, or rows loaded without the trigger).
                        SELECT
                            @SPName = CAST(p.F108211 AS NVARCHAR(200)),
                            @Param1 = CAST(p.F108212 AS NVARCHAR(200)),
                            @Param2 = CAST(p.F108213 AS NVARCHAR(200)),
                            @Param3 = CAST(p.F108214 AS NVARCHAR(200)),
                            @Param4 = CAST(p.F108215 AS NVARCHAR(200)),
                            @Param5 = CAST(p.F108216 AS NVARCHAR(200)),
                            @TooLong = CASE
                                WHEN
                                    LEN(CAST(p.F108211 AS NVARCHAR(4000)) + N'.') > 201
                                    OR LEN(CAST(p.F108212 AS NVARCHAR(MAX)) + N'.') > 201
                                    OR LEN(CAST(p.F108213 AS NVARCHAR(MAX)) + N'.') > 201
                                    OR LEN(CAST(p.F108214 AS NVARCHAR(MAX)) + N'.') > 201
                                    OR LEN(CAST(p.F108215 AS NVARCHAR(MAX)) + N'.') > 201
                                    OR LEN(CAST(p.F108216 AS NVARCHAR(MAX)) + N'.') > 201
                                    THEN 1
                                ELSE 0
                            END
                        FROM dbo.tabDIYTable12402 AS p
                        WHERE p.ID = @TaskID;

                        IF @@ROWCOUNT = 0
                            EXEC delay.FinishTask
                                @SetReceipt = 0,
                                @TaskID = @TaskID,
                                @TaskState = N'Cancelled',
                                @EventName = N'Cancelled',
                                @ErrorNumber = 50332,
                                @ErrorMessage = N'the platform row was deleted before the task ran';
                        ELSE IF @Refusal IS NOT NULL OR @TooLong = 1
                        BEGIN
                            IF @Refusal IS NULL
                                SELECT
                                    @Refusal = 50303,
                                    @RefusalMessage = CONCAT(
                                        N'a value F108211-F108216 is longer than the target''s 200 characters; ',
                                        N'refused, not cut'
                                    );
                            EXEC delay.FinishTask
                                @SetReceipt = 0,
                                @TaskID = @TaskID,
                                @TaskState = N'Refused',
                                @EventName = N'Refused',
                                @ErrorNumber = @Refusal,
                                @ErrorMessage = @RefusalMessage;
                        END;
                        ELSE
                        BEGIN
                            -- The run lock is taken here, before this
                            -- transaction commits the task as Running: a
                            -- watchdog that fires between that commit and the
                            -- target must find it held, or it would declare the
                            -- runner lost and start a second run (spin found
                            -- that race: models/delayexec.pml, delay-stale-runner).
                            -- Session-owned, so the COMMIT below keeps it;
                            -- released once, at the end of this pass, or by the
                            -- session's end.
                            SET @LockName = CONCAT(N'mailq-db/delay/task/', @TaskID);
                            EXEC @LockResult = sys.sp_getapplock
                                @Resource = @LockName,
                                @LockMode = N'Exclusive',
                                @LockOwner = N'Session',
                                @LockTimeout = 0;
                            IF @LockResult >= 0
                                SET @LockHeld = 1;

                            IF @LockHeld = 0
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
                            ELSE
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
                                -- (for a DelayRequest it was set above, before
                                -- the row lock; setting it again is harmless).
                                SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                                BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                                SET @Run = 1;
                            END;
                        END;
                    END;
                END;
            END;

            COMMIT TRANSACTION;
            SET @Step1Committed = 1;
            -- The redelivered message went through: a later message of the
            -- same conversation (the next timer of a chained delay, a lease,
            -- a retry) gets its own redelivery on a deadlock, as the header
            -- says ("first time for this message"), instead of the recovery.
            IF @RedeliveredHandle = @Handle
                SET @RedeliveredHandle = NULL;
        END TRY
        BEGIN CATCH
            SELECT @ErrorNumber = ERROR_NUMBER(), @ErrorMessage = ERROR_MESSAGE(), @Run = 0;
            -- The message goes back to the queue: one rollback of it.  (A run
            -- lock taken in this step survives the rollback, being
            -- session-owned; it is released once, at the end of this pass.)
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;

            IF @Handle IS NULL
            BEGIN
                -- Nothing received: the queue itself failed (e.g. disabled,
                -- error 9617).  Say so in the error log, and stop; activation
                -- starts readers again once the queue is enabled.
                -- N'%s': the text is an argument, so a % in an error message
                -- is never read as a format specification.
                SET @LogText = CONCAT(
                    N'mailq-db dbo.ProcessDelayQueue: RECEIVE from dbo.DelayServiceQueue failed (error ',
                    @ErrorNumber, N': ', @ErrorMessage, N'); the reader stops. See delay.Health.'
                );
                RAISERROR (N'%s', 16, 1, @LogText);
                SET @Stop = 1;
            END;
            ELSE IF @ErrorNumber IN (1205, 50350) AND (@RedeliveredHandle IS NULL OR @RedeliveredHandle <> @Handle)
                -- Deadlock victim: transient.  One ordinary redelivery: the
                -- message is back on the queue and the next RECEIVE gets it.
                SET @RedeliveredHandle = @Handle;
            ELSE
                SET @Recover = 1;
        END CATCH;

        --==================================================================
        -- RECOVERY: only after a failed step 1.  Minimal on purpose: it does
        -- nothing that the failed step 1 did (no delay.FinishTask, no
        -- delay.Task, no platform table), so the failure cannot repeat here.
        --==================================================================
        IF @Recover = 1
        BEGIN
            BEGIN TRY
                BEGIN TRANSACTION;

                -- RECEIVE ... WHERE conversation_handle = @Handle takes only a
                -- message of this conversation (RECEIVE, WHERE clause:
                -- https://learn.microsoft.com/en-us/sql/t-sql/statements/receive-transact-sql).
                -- Another reader idle in WAITFOR (RECEIVE) may have taken it
                -- since our rollback: then nothing is received, and that
                -- reader owns the message.
                RECEIVE TOP (1) @Body = message_body
                FROM dbo.DelayServiceQueue
                WHERE conversation_handle = @Handle;

                IF @@ROWCOUNT > 0
                BEGIN
                    INSERT INTO delay.Incident (
                        ConversationHandle, MessageType, TaskID, ErrorNumber, ErrorMessage
                    )
                    VALUES (@Handle, @MessageType, @TaskID, @ErrorNumber, LEFT(@ErrorMessage, 4000));

                    END CONVERSATION @Handle;
                    SET @Recovered = 1;
                END;

                COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- Twice in a row: stop this reader rather than spin, and say
                -- so where a DBA looks.  (Not WITH LOG: that needs sysadmin or
                -- ALTER TRACE (RAISERROR, WITH LOG:
                -- https://learn.microsoft.com/en-us/sql/t-sql/language-elements/raiserror-transact-sql),
                -- which the activation's dbo impersonation does not carry in a
                -- database not marked trusted, so it would fail with 2778
                -- and log nothing; a reader's RAISERROR output is written to
                -- the error log by activation itself:
                -- https://learn.microsoft.com/en-us/previous-versions/sql/sql-server-2008-r2/ms171585(v=sql.105))
                SET @LogText = CONCAT(
                    N'mailq-db dbo.ProcessDelayQueue: the recovery of a ', @MessageType, N' message on conversation ',
                    @Handle, N' failed (error ', @StepErrorNumber, N': ', @StepErrorMessage,
                    N') after step 1 failed (error ', @ErrorNumber, N': ', @ErrorMessage, N'); the reader stops.'
                );
                RAISERROR (N'%s', 16, 1, @LogText);
                SET @Stop = 1;
            END CATCH;
        END;

        --==================================================================
        -- RECOVERY FOLLOW-UP: outside any RECEIVE transaction.  A task still
        -- waiting on the conversation the recovery ended would never fire:
        -- fail it (receipt 3).  A Running task is left to its runner's step 3.
        --==================================================================
        IF @Recovered = 1 AND @TaskID IS NOT NULL
        BEGIN
            BEGIN TRY
                BEGIN TRANSACTION;
                -- The conversation is gone (ended above), so the task row is
                -- the first lock here.
                SET @TaskState = NULL;
                SELECT @TaskState = t.TaskState
                FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
                WHERE t.TaskID = @TaskID AND t.ConversationHandle = @Handle;

                IF @TaskState IN (N'Scheduled', N'Retrying')
                BEGIN
                    SET @StepErrorMessage = CONCAT(
                        N'dbo.ProcessDelayQueue could not process a ', @MessageType,
                        N' message of this task (error ', @ErrorNumber, N': ', LEFT(@ErrorMessage, 3000),
                        N'); the message was recorded in delay.Incident and its conversation ended'
                    );
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'BrokerError',
                        @ErrorNumber = 50346,
                        @ErrorMessage = @StepErrorMessage;
                END;

                COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- No RECEIVE in this transaction: its rollback never counts
                -- against the queue.  delay.Reconcile finds the task later.
                SET @LogText = CONCAT(
                    N'mailq-db dbo.ProcessDelayQueue: task ', @TaskID,
                    N' could not be failed after its message was recovered (error ', @StepErrorNumber, N': ',
                    @StepErrorMessage, N'); delay.Reconcile will find it.'
                );
                RAISERROR (N'%s', 10, 1, @LogText);
            END CATCH;
        END;

        --==================================================================
        -- STEP 2: run the target in its own transaction.
        --==================================================================
        IF @Run = 1
        BEGIN
            -- This session holds the task's run lock since step 1 (session-owned:
            -- it survives the target's COMMIT or ROLLBACK).
            SELECT @ErrorNumber = NULL, @ErrorMessage = NULL, @Retryable = 1;

            -- Built from the catalog's names (delay.ResolveTarget checked the
            -- allow-list, the object's identity and its pinned definition),
            -- each part QUOTENAMEd; the six values are parameters, never part
            -- of the text.  The SET options apply to the target only: a SET in
            -- a batch run by sp_executesql reverts when that batch returns
            -- (https://learn.microsoft.com/en-us/sql/t-sql/statements/set-statements-transact-sql).
            -- The lock timeout is an INT from delay.Setting, so its text is
            -- digits only.
            SET @Sql = CONCAT(
                N'SET DEADLOCK_PRIORITY NORMAL; SET XACT_ABORT OFF; SET LOCK_TIMEOUT ',
                ISNULL(@TargetLockTimeoutMs, -1), N'; ',
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
                SELECT
                    @ErrorNumber = ERROR_NUMBER(),
                    @ErrorMessage = ERROR_MESSAGE(),
                    @TargetTranCount = @@TRANCOUNT;
                -- Doomed (-1) or not (1): the target's work is undone as a whole.
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- 266 with more than our one transaction open: the target
                -- left one of its own open; all of it was rolled back just
                -- now, so it is retried (50335).  266 with none open: the
                -- target committed or rolled back the transaction opened for
                -- it; what it did may be committed, so it is not run again.
                IF @ErrorNumber = 266 AND @TargetTranCount > 1
                    SELECT
                        @ErrorNumber = 50335,
                        @ErrorMessage = CONCAT(
                            N'the target left ', @TargetTranCount - 1, N' transaction(s) open; rolled back: ',
                            @ErrorMessage
                        );
                ELSE IF @ErrorNumber = 266
                    SELECT
                        @Retryable = 0,
                        @ErrorMessage = CONCAT(
                            N'the target committed or rolled back the transaction opened for it ',
                            N'(its work may be committed; not retried): ', @ErrorMessage
                        );
            END CATCH;

            -- The reader's own settings, re-asserted after the target.
            SET XACT_ABORT ON;
            SET DEADLOCK_PRIORITY HIGH;
            SET LOCK_TIMEOUT -1;

            --==============================================================
            -- STEP 3: record the outcome in a new transaction (retried on
            -- deadlock).
            --==============================================================
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
                            WHERE e.conversation_handle = @TaskHandle AND e.state NOT IN ('CD', 'ER', 'DI')
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

        --==================================================================
        -- RECEIPT: a task that step 1 or step 3 made final gets its receipt
        -- here, in a statement of its own after that COMMIT: no transaction
        -- that RECEIVEd ever writes the platform's table, and a failure there
        -- (a constraint or trigger of the platform's) can never undo the
        -- recorded outcome of a target that ran (step 3 rolled back would
        -- leave the task Running, and the watchdog would run it again).  The
        -- task is still final in delay.Task; delay.Reconcile repairs the
        -- receipt later.
        --==================================================================
        IF @TaskID IS NOT NULL AND ((@Step1Committed = 1 AND @Run = 0) OR @Recorded = 1)
        BEGIN
            BEGIN TRY
                UPDATE p
                SET F108219 = CASE t.TaskState
                    WHEN N'Done' THEN 1
                    WHEN N'Refused' THEN 2
                    WHEN N'Failed' THEN 3
                    WHEN N'Cancelled' THEN 4
                    ELSE 0
                END
                FROM dbo.tabDIYTable12402 AS p
                INNER JOIN delay.Task AS t ON p.ID = t.TaskID
                WHERE
                    p.ID = @TaskID
                    AND t.TaskState IN (N'Done', N'Refused', N'Failed', N'Cancelled')
                    AND ISNULL(p.F108219, 0) = 0;
            END TRY
            BEGIN CATCH
                SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                SET @LogText = CONCAT(
                    N'mailq-db dbo.ProcessDelayQueue: the receipt of task ', @TaskID, N' could not be written (error ',
                    @StepErrorNumber, N': ', @StepErrorMessage, N'); delay.Reconcile repairs it.'
                );
                RAISERROR (N'%s', 10, 1, @LogText);
            END CATCH;
        END;

        --==================================================================
        -- RELEASE: the run lock, exactly once per pass that took it.  The
        -- flag is cleared first, so no path can release it twice (a second
        -- sp_releaseapplock of a lock not held raises error 1223).
        --==================================================================
        IF @LockHeld = 1
        BEGIN
            SET @LockHeld = 0;
            EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';
        END;
    END;
END;
