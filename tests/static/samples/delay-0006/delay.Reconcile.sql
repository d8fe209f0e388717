/*
delay.Reconcile: finds delayed tasks that can no longer fire, and platform rows
that never got a task, and repairs or reports them.  Run it after a database
copy or restore, after a bulk load into dbo.tabDIYTable12402, once after
migrating from the seed design (@ScheduleMissing = 1, the one-off backfill),
and from a SQL Server Agent job every few minutes (`mailq-db doctor` runs it
with @Apply = 0).
Parameters:  @Apply BIT = 1            0: report only, change nothing
             @ScheduleMissing BIT = 0  1: also schedule platform rows that have
                                       no task (receipt 0, a name, no delay.Task
                                       row: inserted with the trigger disabled,
                                       or bulk loaded, which skips triggers by
                                       default); 0: only report them
             @MaxRows INT = 1000       at most this many repairs per kind
Result set:  one row per finding: Finding NVARCHAR(32), TaskID BIGINT,
             Action NVARCHAR(32), Detail NVARCHAR(400).  Findings:
             QueueDisabled   dbo.DelayServiceQueue does not receive (poison
                             message detection disabled it): also raised as an
                             error (severity 16), so an Agent job step fails
                             and its alert fires; fix the cause (delay.Incident,
                             delay.Log), then ALTER QUEUE ... WITH STATUS = ON
             Orphaned        a Scheduled/Retrying task whose conversation no
                             longer exists (NEW_BROKER gives the database a
                             new broker identifier and removes every
                             conversation without an EndDialog, see
                             "Managing Service Broker Identities" below): a
                             new conversation and timer for the rest of its
                             delay (Rearmed)
             RunnerGone      a Running task with no conversation and no runner
                             holding its run lock: retried (Rearmed, counts as
                             an attempt) or, out of attempts, Failed (50348)
             NoTask          a pending platform row without a task: Scheduled
                             or Refused (with @ScheduleMissing = 1), else
                             Reported
             Receipt         a final task whose platform receipt is still 0
                             (its write after the RECEIVE transaction failed):
                             Repaired
             (an Orphaned task whose conversation a recovery ended, recorded
             in delay.Incident, is Failed, never re-armed)
References:  https://learn.microsoft.com/en-us/previous-versions/sql/sql-server-2008-r2/ms166057(v=sql.105)
Timing:      a re-armed task keeps its NextRunAtUtc (at least 1 s from now); a
             backfilled row is due F108218 seconds after F108217 (its created
             time, taken as UTC) or, without F108217, after now.
Transaction: one short transaction per repaired task (never one big one), each
             opened here; call it outside a transaction (50349 otherwise).
Lock order:  the task row (UPDLOCK; its old conversation is gone, so there is
             no conversation group to take first), then the new conversation
             (nobody else knows it yet), then dbo.tabDIYTable12402.
Security:    EXECUTE AS OWNER (conversations belong to dbo); for db_owner and
             MailqAdmin.
Example:     EXEC delay.Reconcile @Apply = 0;   -- what would it do?
             EXEC delay.Reconcile @ScheduleMissing = 1;
*/
CREATE OR ALTER PROCEDURE delay.Reconcile
    @Apply BIT = 1,
    @ScheduleMissing BIT = 0,
    @MaxRows INT = 1000
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE
        @Msg NVARCHAR(2048),
        @Now DATETIME2(3),
        @TaskID BIGINT,
        @TaskState NVARCHAR(16),
        @Handle UNIQUEIDENTIFIER,
        @NewHandle UNIQUEIDENTIFIER,
        @NextRunAtUtc DATETIME2(3),
        @Attempts INT,
        @MaxAttempts INT = 3,
        @Timeout INT,
        @MaxTimerSeconds INT = 86400,
        @MaxDelaySeconds INT = 31536000,
        @Name NVARCHAR(4000),
        @DelaySeconds INT,
        @CreatedAt DATETIME2(3),
        @TooLong BIT,
        @Refusal INT,
        @RefusalMessage NVARCHAR(400),
        @SchemaName SYSNAME,
        @ProcedureName SYSNAME,
        @Done INT;

    DECLARE @Finding TABLE (
        FindingId INT IDENTITY (1, 1) PRIMARY KEY,
        Finding NVARCHAR(32) NOT NULL,
        TaskID BIGINT NULL,
        Action NVARCHAR(32) NOT NULL,
        Detail NVARCHAR(400) NULL
    );

    IF @@TRANCOUNT > 0
        THROW 50349, N'delay.Reconcile opens one short transaction per task; call it outside a transaction.', 1;
    SET @Apply = ISNULL(@Apply, 1);
    SET @ScheduleMissing = ISNULL(@ScheduleMissing, 0);
    SET @MaxRows = IIF(@MaxRows IS NULL OR @MaxRows < 1, 1000, @MaxRows);

    SELECT @MaxAttempts = s.MaxAttempts FROM delay.Setting AS s WHERE s.SettingId = 1;

    -- 1. The queue.
    IF EXISTS (
        SELECT 1 FROM sys.service_queues AS q
        WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue') AND q.is_receive_enabled = 0
    )
        INSERT INTO @Finding (Finding, Action, Detail)
        VALUES (
            N'QueueDisabled', N'Reported',
            N'dbo.DelayServiceQueue is disabled; see delay.Incident, delay.Log; then ALTER QUEUE ... STATUS = ON'
        );

    -- 2. Pending and running tasks whose conversation is gone.
    SET @TaskID = NULL;
    SET @Done = 0;
    WHILE @Done < @MaxRows
    BEGIN
        -- An anti-join against the live endpoints (a CTE, so every column it names
        -- belongs to sys.conversation_endpoints alone); a NULL handle has no
        -- endpoint and counts as gone, as with NOT EXISTS.
        WITH LiveEndpoint AS (
            SELECT e.conversation_handle
            FROM sys.conversation_endpoints AS e
            WHERE e.state NOT IN ('CD', 'ER', 'DI')
        )

        SELECT TOP (1) @TaskID = t.TaskID
        FROM delay.Task AS t
        LEFT OUTER JOIN LiveEndpoint AS live ON t.ConversationHandle = live.conversation_handle
        WHERE
            t.TaskState IN (N'Scheduled', N'Retrying', N'Running')
            AND (@TaskID IS NULL OR t.TaskID > @TaskID)
            AND live.conversation_handle IS NULL
        ORDER BY t.TaskID;
        IF @@ROWCOUNT = 0
            BREAK;
        SET @Done += 1;

        BEGIN TRY
            BEGIN TRANSACTION;

            -- UPDLOCK, ROWLOCK: re-read under the lock; the task may have
            -- moved on since the scan.
            SELECT
                @TaskState = t.TaskState,
                @Handle = t.ConversationHandle,
                @NextRunAtUtc = t.NextRunAtUtc,
                @Attempts = t.Attempts
            FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
            WHERE t.TaskID = @TaskID;
            SET @Now = SYSUTCDATETIME();

            IF @TaskState IN (N'Scheduled', N'Retrying', N'Running') AND NOT EXISTS (
                SELECT 1 FROM sys.conversation_endpoints AS e
                WHERE e.conversation_handle = @Handle AND e.state NOT IN ('CD', 'ER', 'DI')
            )
            BEGIN
                IF @TaskState = N'Running'
                    AND APPLOCK_TEST(N'public', CONCAT(N'mailq-db/delay/task/', @TaskID), N'Exclusive', N'Session') = 0
                    -- Its runner is alive: its step 3 records the outcome
                    -- without a conversation.
                    INSERT INTO @Finding (Finding, TaskID, Action, Detail)
                    VALUES (N'RunnerGone', @TaskID, N'Left', N'running, its runner is alive; step 3 records it');
                ELSE IF EXISTS (
                    SELECT 1 FROM delay.Incident AS i
                    WHERE i.ConversationHandle = @Handle OR i.TaskID = @TaskID
                )
                BEGIN
                    -- dbo.ProcessDelayQueue could not process its message and
                    -- ended the conversation (delay.Incident): failed, never
                    -- re-armed into the same failure.
                    INSERT INTO @Finding (Finding, TaskID, Action, Detail)
                    VALUES (
                        N'Orphaned', @TaskID, N'Failed', N'its conversation was ended by a recovery (delay.Incident)'
                    );
                    IF @Apply = 1
                        EXEC delay.FinishTask
                            @TaskID = @TaskID,
                            @TaskState = N'Failed',
                            @EventName = N'BrokerError',
                            @ErrorNumber = 50346,
                            @ErrorMessage = N'a message of this task could not be processed (delay.Incident)';
                END;
                ELSE IF @TaskState = N'Running' AND @Attempts >= @MaxAttempts
                BEGIN
                    INSERT INTO @Finding (Finding, TaskID, Action) VALUES (N'RunnerGone', @TaskID, N'Failed');
                    IF @Apply = 1
                        EXEC delay.FinishTask
                            @TaskID = @TaskID,
                            @TaskState = N'Failed',
                            @EventName = N'RunnerLost',
                            @ErrorNumber = 50348,
                            @ErrorMessage = N'running with neither a conversation nor a runner; attempts exhausted';
                END;
                ELSE
                BEGIN
                    INSERT INTO @Finding (Finding, TaskID, Action, Detail)
                    VALUES (
                        IIF(@TaskState = N'Running', N'RunnerGone', N'Orphaned'), @TaskID, N'Rearmed',
                        CONCAT(N'was ', @TaskState, N' on a conversation that no longer exists')
                    );
                    IF @Apply = 1
                    BEGIN
                        BEGIN DIALOG CONVERSATION @NewHandle
                            FROM SERVICE MailqDelayService
                            TO SERVICE N'MailqDelayService', N'CURRENT DATABASE'
                            ON CONTRACT MailqDelayContract
                            WITH ENCRYPTION = OFF;

                        SET @NextRunAtUtc = IIF(
                            @TaskState = N'Running' OR @NextRunAtUtc IS NULL OR @NextRunAtUtc < @Now,
                            @Now, @NextRunAtUtc
                        );
                        SET @Timeout = CAST(CASE
                            WHEN DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc) >= @MaxTimerSeconds THEN @MaxTimerSeconds
                            WHEN DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc) < 1 THEN 1
                            ELSE DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc)
                        END AS INT);
                        BEGIN CONVERSATION TIMER (@NewHandle) TIMEOUT = @Timeout;

                        UPDATE delay.Task
                        SET
                            ConversationHandle = @NewHandle,
                            TaskState = IIF(@TaskState = N'Running', N'Retrying', @TaskState),
                            NextRunAtUtc = @NextRunAtUtc,
                            LeaseUntilUtc = NULL,
                            LastErrorNumber = IIF(@TaskState = N'Running', 50348, LastErrorNumber),
                            LastErrorMessage = IIF(
                                @TaskState = N'Running',
                                N'running with neither a conversation nor a runner; retried (delay.Reconcile)',
                                LastErrorMessage
                            )
                        WHERE TaskID = @TaskID;

                        INSERT INTO delay.Log (TaskID, EventName, ErrorNumber, ErrorMessage, ConversationHandle)
                        VALUES (
                            @TaskID, IIF(@TaskState = N'Running', N'RunnerLost', N'BrokerError'), 50348,
                            CONCAT(N'conversation ', CAST(@Handle AS NVARCHAR(36)),
                                N' no longer exists; re-armed on a new one by delay.Reconcile'),
                            @NewHandle
                        );
                    END;
                END;
            END;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;
            INSERT INTO @Finding (Finding, TaskID, Action, Detail)
            VALUES (N'Orphaned', @TaskID, N'Error', LEFT(CONCAT(ERROR_NUMBER(), N': ', ERROR_MESSAGE()), 400));
        END CATCH;
    END;

    -- 3. Pending platform rows without a task.
    SET @TaskID = NULL;
    SET @Done = 0;
    WHILE @Done < @MaxRows
    BEGIN
        SELECT TOP (1)
            @TaskID = p.ID,
            @Name = CAST(p.F108211 AS NVARCHAR(4000)),
            @DelaySeconds = CASE WHEN p.F108218 IS NULL THEN 0 ELSE TRY_CONVERT(INT, p.F108218) END,
            @CreatedAt = TRY_CONVERT(DATETIME2(3), p.F108217),
            @TooLong = CASE
                WHEN
                    LEN(CAST(p.F108212 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(p.F108213 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(p.F108214 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(p.F108215 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(p.F108216 AS NVARCHAR(MAX)) + N'.') > 201
                    THEN 1
                ELSE 0
            END
        FROM dbo.tabDIYTable12402 AS p
        WHERE
            ISNULL(p.F108219, 0) = 0
            AND p.F108211 IS NOT NULL
            AND (@TaskID IS NULL OR p.ID > @TaskID)
            AND NOT EXISTS (SELECT 1 FROM delay.Task AS t WHERE t.TaskID = p.ID)
        ORDER BY p.ID;
        IF @@ROWCOUNT = 0
            BREAK;
        SET @Done += 1;

        IF @Apply = 0 OR @ScheduleMissing = 0
        BEGIN
            INSERT INTO @Finding (Finding, TaskID, Action, Detail)
            VALUES (
                N'NoTask', @TaskID, N'Reported', N'pending row, no task; EXEC delay.Reconcile @ScheduleMissing = 1'
            );
            CONTINUE;
        END;

        SELECT
            @Refusal = r.RefusalNumber,
            @RefusalMessage = r.RefusalMessage,
            @SchemaName = r.SchemaName,
            @ProcedureName = r.ProcedureName
        FROM delay.ResolveTarget(@Name) AS r;
        IF @DelaySeconds IS NULL OR @DelaySeconds NOT BETWEEN 0 AND @MaxDelaySeconds
            SELECT @Refusal = 50302, @RefusalMessage = N'delay F108218 is not 0-31,536,000 seconds';
        ELSE IF @TooLong = 1
            SELECT
                @Refusal = 50303,
                @RefusalMessage = N'a parameter F108212-F108216 is longer than the target''s 200 characters';

        SET @Now = SYSUTCDATETIME();
        SET @NextRunAtUtc = DATEADD(SECOND, ISNULL(@DelaySeconds, 0), ISNULL(@CreatedAt, @Now));

        BEGIN TRY
            BEGIN TRANSACTION;

            INSERT INTO delay.Task (
                TaskID, TargetName, SchemaName, ProcedureName, DelaySeconds, TaskState,
                CreatedAtUtc, DueAtUtc, NextRunAtUtc, FinishedAtUtc, LastErrorNumber, LastErrorMessage, CreatedBy
            )
            VALUES (
                @TaskID, LEFT(@Name, 400), @SchemaName, @ProcedureName, @DelaySeconds,
                IIF(@Refusal IS NULL, N'Scheduled', N'Refused'),
                @Now,
                IIF(@Refusal IS NULL, @NextRunAtUtc, NULL),
                IIF(@Refusal IS NULL, @NextRunAtUtc, NULL),
                IIF(@Refusal IS NULL, NULL, @Now),
                @Refusal, @RefusalMessage, N'delay.Reconcile'
            );

            IF @Refusal IS NOT NULL
            BEGIN
                INSERT INTO delay.Log (TaskID, EventName, TargetName, ErrorNumber, ErrorMessage)
                VALUES (@TaskID, N'Refused', LEFT(@Name, 400), @Refusal, @RefusalMessage);
                UPDATE dbo.tabDIYTable12402 SET F108219 = 2 WHERE ID = @TaskID;
                INSERT INTO @Finding (Finding, TaskID, Action, Detail)
                VALUES (N'NoTask', @TaskID, N'Refused', @RefusalMessage);
            END;
            ELSE
            BEGIN
                BEGIN DIALOG CONVERSATION @NewHandle
                    FROM SERVICE MailqDelayService
                    TO SERVICE N'MailqDelayService', N'CURRENT DATABASE'
                    ON CONTRACT MailqDelayContract
                    WITH ENCRYPTION = OFF;
                SET @Timeout = CAST(CASE
                    WHEN DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc) >= @MaxTimerSeconds THEN @MaxTimerSeconds
                    WHEN DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc) < 1 THEN 1
                    ELSE DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc)
                END AS INT);
                BEGIN CONVERSATION TIMER (@NewHandle) TIMEOUT = @Timeout;
                UPDATE delay.Task SET ConversationHandle = @NewHandle WHERE TaskID = @TaskID;
                INSERT INTO @Finding (Finding, TaskID, Action) VALUES (N'NoTask', @TaskID, N'Scheduled');
            END;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;
            INSERT INTO @Finding (Finding, TaskID, Action, Detail)
            VALUES (N'NoTask', @TaskID, N'Error', LEFT(CONCAT(ERROR_NUMBER(), N': ', ERROR_MESSAGE()), 400));
        END CATCH;
    END;

    -- 4. Receipts that could not be written (dbo.ProcessDelayQueue writes
    -- them after its RECEIVE transaction commits, so a constraint or trigger
    -- of the platform's can leave one behind).
    BEGIN TRY
        IF @Apply = 1
            UPDATE TOP (@MaxRows) p
            SET F108219 = CASE t.TaskState
                WHEN N'Done' THEN 1
                WHEN N'Refused' THEN 2
                WHEN N'Failed' THEN 3
                WHEN N'Cancelled' THEN 4
                ELSE 0
            END
            OUTPUT N'Receipt', inserted.ID, N'Repaired' INTO @Finding (Finding, TaskID, Action)
            FROM dbo.tabDIYTable12402 AS p
            INNER JOIN delay.Task AS t ON p.ID = t.TaskID
            WHERE t.TaskState IN (N'Done', N'Refused', N'Failed', N'Cancelled') AND ISNULL(p.F108219, 0) = 0;
        ELSE
            INSERT INTO @Finding (Finding, TaskID, Action)
            SELECT TOP (@MaxRows) N'Receipt', p.ID, N'Reported'
            FROM dbo.tabDIYTable12402 AS p
            INNER JOIN delay.Task AS t ON p.ID = t.TaskID
            WHERE t.TaskState IN (N'Done', N'Refused', N'Failed', N'Cancelled') AND ISNULL(p.F108219, 0) = 0;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() <> 0
            ROLLBACK TRANSACTION;
        INSERT INTO @Finding (Finding, Action, Detail)
        VALUES (N'Receipt', N'Error', LEFT(CONCAT(ERROR_NUMBER(), N': ', ERROR_MESSAGE()), 400));
    END CATCH;

    SELECT f.Finding, f.TaskID, f.Action, f.Detail
    FROM @Finding AS f
    ORDER BY f.FindingId;

    IF EXISTS (SELECT 1 FROM @Finding AS f WHERE f.Finding = N'QueueDisabled')
        -- Severity 16: an Agent job step that runs this fails, so the job's
        -- notification or an alert on the job failure tells a DBA.  (A
        -- BROKER_QUEUE_DISABLED event notification would need a second queue
        -- and service to receive it; this monitor needs none.)
        RAISERROR (
            N'mailq-db: dbo.DelayServiceQueue is disabled (poison message detection); see %s, then %s.',
            16, 1, N'delay.Incident and delay.Log', N'ALTER QUEUE dbo.DelayServiceQueue WITH STATUS = ON'
        );
END;
