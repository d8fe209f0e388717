/*
delay.Monitor: is delayed execution running its tasks?  One row per finding, with
what to do.  The Agent job step `EXEC delay.Monitor;` every few minutes fails (50545)
on a Critical one, so its alert fires; `mailq-db doctor` runs @Apply = 0, @Raise = 0.
Critical:    BrokerDisabled, QueueDisabled, ActivationOff, RunnerMissing, CopyNotEnabled
             (a new broker identity: runs nothing until delay.EnableThisDatabase),
             ActivationFailing (the timer fired, no reader came), OverdueTasks.
Warning:     DispatcherLost (begun again, @Apply = 1), HeldTasks (per target),
             OrphanedRuns (a target ended the transaction opened for it, then its reader
             ended: failed, 50546, @Apply = 1), NoTask (with
             @ScheduleMissing = 1: platform rows without a task, scheduled, @MaxRows at most).
Result set:  Finding NVARCHAR(32), Severity NVARCHAR(8), Detail, Fix NVARCHAR(800)
Errors:      50545 after the result set, on a Critical finding, when @Raise = 1.  Isolation: READ COMMITTED.
Security:    EXECUTE AS OWNER (the catalog and the queue); granted to MailqAdmin.
Example:     EXEC delay.Monitor @Apply = 0, @Raise = 0;
*/
CREATE OR ALTER PROCEDURE delay.Monitor
    @Apply BIT = 1,
    @Raise BIT = 1,
    @OverdueLimit INT = 0,
    @ScheduleMissing BIT = 0,
    @MaxRows INT = 1000
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE
        @Now DATETIME2(3) = SYSUTCDATETIME(), @Overdue INT = 60, @Count BIGINT, @Msg NVARCHAR(2048),
        @Handle UNIQUEIDENTIFIER, @ArmedFor DATETIME2(3), @Woken DATETIME2(3), @Guid UNIQUEIDENTIFIER;
    DECLARE @Finding TABLE (
        Id INT IDENTITY (1, 1) PRIMARY KEY, Finding NVARCHAR(32) NOT NULL, Severity NVARCHAR(8) NOT NULL,
        Detail NVARCHAR(800) NULL, Fix NVARCHAR(800) NULL
    );
    SELECT @Overdue = s.OverdueSeconds FROM delay.Setting AS s WHERE s.SettingId = 1;
    SELECT @Handle = d.ConversationHandle, @ArmedFor = d.ArmedForUtc, @Woken = d.LastWokenAtUtc, @Guid = d.BrokerGuid
    FROM delay.Dispatcher AS d
    WHERE d.DispatcherId = 1;
    INSERT INTO @Finding (Finding, Severity, Detail, Fix)
    SELECT x.Finding, x.Severity, x.Detail, x.Fix
    FROM sys.databases AS db
    CROSS JOIN sys.service_queues AS q
    CROSS APPLY (
        VALUES
        (IIF(db.is_broker_enabled = 0, N'BrokerDisabled', NULL), N'Critical', N'Service Broker is off: no timer fires',
            N'ALTER DATABASE ... SET ENABLE_BROKER (exclusive access); a copy: NEW_BROKER (see CopyNotEnabled)'),
        (IIF(q.is_receive_enabled = 0, N'QueueDisabled', NULL), N'Critical', N'dbo.DelayServiceQueue is disabled',
            N'read delay.Log and the error log, then ALTER QUEUE dbo.DelayServiceQueue WITH STATUS = ON;'),
        (IIF(q.is_activation_enabled = 0, N'ActivationOff', NULL), N'Critical', N'activation is off: no reader starts',
            N'ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON);'),
        (IIF(DATABASE_PRINCIPAL_ID(N'MailqRunner') IS NULL, N'RunnerMissing', NULL), N'Critical',
            N'the user MailqRunner (targets and hooks run as it) is missing', N'deploy again: mailq-db deploy'),
        (IIF(@Guid IS NULL OR @Guid <> db.service_broker_guid, N'CopyNotEnabled', NULL), N'Critical',
            CONCAT(N'broker identity ', db.service_broker_guid, N' is not the one tasks run for (', @Guid, N')'),
            N'on the live database only: EXEC delay.EnableThisDatabase @Confirm = 1; a copy runs nothing'),
        (IIF(@ArmedFor < DATEADD(SECOND, -@Overdue, @Now) AND (@Woken IS NULL OR @Woken < @ArmedFor)
            AND @Guid = db.service_broker_guid, N'ActivationFailing', NULL), N'Critical',   -- not on a copy
            CONCAT(N'the timer fired at ', @ArmedFor, N'; no reader since'),
            N'see the SQL Server error log (an orphaned owner: ALTER AUTHORIZATION ON DATABASE::... TO [login])')
    ) AS x(Finding, Severity, Detail, Fix)
    WHERE db.database_id = DB_ID() AND q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue') AND x.Finding IS NOT NULL;
    SELECT @Count = COUNT_BIG(*) FROM delay.Task AS t
    WHERE t.TaskState = N'Pending' AND t.NextRunAtUtc < DATEADD(SECOND, -@Overdue, @Now);
    IF @Count > ISNULL(@OverdueLimit, 0)
        INSERT INTO @Finding (Finding, Severity, Detail, Fix)
        VALUES (N'OverdueTasks', N'Critical', CONCAT(@Count, N' task(s) due over ', @Overdue, N' s ago not started'),
            N'the findings above; else more MAX_QUEUE_READERS, or a slow target''s MaxReaders holds them');
    INSERT INTO @Finding (Finding, Severity, Detail, Fix)
    SELECT N'HeldTasks', N'Warning', CONCAT(COUNT_BIG(*), N' task(s) of ', t.SchemaName, N'.', t.ProcedureName,
            N' held: it changed since it was listed'),
        CONCAT(N'review it, then EXEC delay.AllowProcedure N''', t.SchemaName, N'.', t.ProcedureName, N''';')
    FROM delay.Task AS t
    WHERE t.TaskState = N'Held'
    GROUP BY t.SchemaName, t.ProcedureName;
    IF @Handle IS NULL OR NOT EXISTS (
        SELECT 1 FROM sys.conversation_endpoints AS e
        WHERE e.conversation_handle = @Handle AND e.state IN ('SO', 'SI', 'CO')
    )
    BEGIN
        INSERT INTO @Finding (Finding, Severity, Detail, Fix)
        VALUES (N'DispatcherLost', N'Warning', N'the dispatcher conversation is gone (NEW_BROKER, an error)',
            IIF(@Apply = 1, N'begun again now', N'EXEC delay.Monitor;'));
        IF @Apply = 1
            EXEC delay.ArmDispatcher @DueAtUtc = @Now;
    END;
    -- The run's mark, no reader holds the row nor the run's session lock: the target committed, its reader ended.
    SELECT @Count = COUNT_BIG(*) FROM delay.Task AS t WITH (READPAST)
    WHERE t.TaskState = N'Claimed' AND t.LeaseUntilUtc = '9999-12-31'
        AND APPLOCK_TEST(N'public', CONCAT(N'mailq-db/delay/run/', t.TaskID), N'Exclusive', N'Session') = 1;
    IF @Count > 0
    BEGIN
        INSERT INTO @Finding (Finding, Severity, Detail, Fix)
        VALUES (N'OrphanedRuns', N'Warning', CONCAT(@Count, N' run(s) ended without an outcome'),
            IIF(@Apply = 1, N'failed now (50546), not run again', N'EXEC delay.Monitor;'));
        IF @Apply = 1
            UPDATE t
            SET
                t.TaskState = N'Failed', t.FinishedAtUtc = @Now, t.ClaimToken = NULL, t.LeaseUntilUtc = NULL,
                t.LastErrorNumber = 50546,
                t.LastErrorMessage = N'the target ended its transaction, then its reader ended'
            OUTPUT inserted.TaskID INTO delay.ReceiptDue (TaskID)
            FROM delay.Task AS t WITH (READPAST, ROWLOCK)
            WHERE t.TaskState = N'Claimed' AND t.LeaseUntilUtc = '9999-12-31'
                AND APPLOCK_TEST(N'public', CONCAT(N'mailq-db/delay/run/', t.TaskID), N'Exclusive', N'Session') = 1;
    END;
    IF @ScheduleMissing = 1
    BEGIN
        -- Rows inserted without the trigger: due F108218 s after F108217 (or now); a scan, when asked.
        INSERT INTO delay.Task (
            TaskID, TargetName, SchemaName, ProcedureName, DelaySeconds, Param1, Param2, Param3, Param4, Param5,
            TaskState, DueAtUtc, NextRunAtUtc, FinishedAtUtc, LastErrorNumber, LastErrorMessage, CreatedBy
        )
        SELECT TOP (@MaxRows)
            p.ID, c.TargetName, c.SchemaName, c.ProcedureName, c.DelaySeconds, c.Param1, c.Param2, c.Param3, c.Param4,
            c.Param5, IIF(c.RefusalNumber IS NULL, N'Pending', N'Refused'), f.Due AS DueAtUtc, f.Due AS NextRunAtUtc,
            IIF(c.RefusalNumber IS NULL, NULL, @Now), c.RefusalNumber, c.RefusalMessage, ORIGINAL_LOGIN()
        FROM dbo.tabDIYTable12402 AS p
        CROSS APPLY delay.Classify(
            CAST(p.F108211 AS NVARCHAR(4000)), CAST(p.F108218 AS NVARCHAR(40)),
            p.F108212, p.F108213, p.F108214, p.F108215, p.F108216
        ) AS c
        CROSS APPLY (
            VALUES (DATEADD(SECOND, ISNULL(c.DelaySeconds, 0), ISNULL(TRY_CONVERT(DATETIME2(3), p.F108217), @Now)))
        ) AS f(Due)
        WHERE ISNULL(p.F108219, 0) = 0 AND p.F108211 IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM delay.Task AS t WHERE t.TaskID = p.ID
        )
        ORDER BY p.ID;
        SET @Count = @@ROWCOUNT;
        INSERT INTO delay.ReceiptDue (TaskID)
        SELECT t.TaskID FROM delay.Task AS t
        WHERE t.TaskState = N'Refused' AND t.FinishedAtUtc = @Now
            AND NOT EXISTS (SELECT 1 FROM delay.ReceiptDue AS r WHERE r.TaskID = t.TaskID);
        IF @Count > 0
        BEGIN
            EXEC delay.ArmDispatcher @DueAtUtc = @Now;
            INSERT INTO @Finding (Finding, Severity, Detail, Fix)
            VALUES (N'NoTask', N'Warning', CONCAT(@Count, N' platform row(s) without a task scheduled now'),
                IIF(@Count = @MaxRows, N'EXEC delay.Monitor @ScheduleMissing = 1; again', NULL));
        END;
    END;
    SELECT f.Finding, f.Severity, f.Detail, f.Fix FROM @Finding AS f ORDER BY f.Id;
    IF @Raise = 1 AND EXISTS (SELECT 1 FROM @Finding AS f WHERE f.Severity = N'Critical')
    BEGIN
        SELECT @Msg = CONCAT(N'delay.Monitor: ', STRING_AGG(f.Finding, N', ')) FROM @Finding AS f
        WHERE f.Severity = N'Critical';
        THROW 50545, @Msg, 1;
    END;
END;
