/*
dbo.trg_tabDIYTable12402_ScheduleDelay: turns every row inserted into the platform's
table into a task of delay.Task, set-based, its values copied now; executes nothing
and opens no dialog.  A row with a non-zero receipt F108219 or a NULL name F108211 is
ignored; every other is refused (receipt 2, delay.Log) when delay.Classify finds a
bad delay (50302), a value over 200 characters (50303), a bad name (50304, 50305) or
one not on the allow-list (50306), else Pending, due F108218 seconds from now (0:
due now; NULL counts as 0).  A bad row never fails the INSERT.  An ID seen before
(the platform truncated its table) replaces the old task (logged, 50332).
Timer:       only when the first new task is due over a second before the armed time
             does delay.ArmDispatcher move the timer (in this transaction); otherwise
             nothing shared is locked beyond a brief read of delay.Dispatcher.
Transaction: the inserting statement's; if it rolls back, nothing is scheduled.
Security:    runs as the inserting user (the platform needs INSERT only); delay tables
             and refusals' receipts by ownership chaining (the platform's triggers fire
             with its own rights); the timer through delay.ArmDispatcher (EXECUTE AS OWNER).
Lock order:  delay.Task (new rows), delay.Log, dbo.tabDIYTable12402, delay.Dispatcher.
Example:     INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108212) VALUES (N'TCXG', 60, N'A-1');
*/
CREATE OR ALTER TRIGGER dbo.trg_tabDIYTable12402_ScheduleDelay
ON dbo.tabDIYTable12402
AFTER INSERT
AS
BEGIN
    SET NOCOUNT ON;
    -- A level set in a trigger reverts when it ends; the reads below must take locks.
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF NOT EXISTS (SELECT 1 FROM inserted) RETURN;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME(), @FirstDue DATETIME2(3), @ArmedFor DATETIME2(3);
    DECLARE @New TABLE (TaskID BIGINT NOT NULL PRIMARY KEY, RefusalNumber INT NULL, NextRunAtUtc DATETIME2(3) NULL);
    -- An ID used again: the old task and its bookkeeping go (logged).
    INSERT INTO delay.Log (TaskID, EventName, TargetName, ErrorNumber, ErrorMessage)
    SELECT t.TaskID, N'Cancelled', t.TargetName, 50332, N'the platform row was replaced by a new row with the same ID'
    FROM delay.Task AS t
    INNER JOIN inserted AS i ON t.TaskID = i.ID;
    IF @@ROWCOUNT > 0
    BEGIN
        DELETE r FROM delay.ReceiptDue AS r INNER JOIN inserted AS i ON r.TaskID = i.ID;
        DELETE k FROM delay.TaskKey AS k INNER JOIN inserted AS i ON k.TaskID = i.ID;
        DELETE t FROM delay.Task AS t INNER JOIN inserted AS i ON t.TaskID = i.ID;
    END;
    -- Every row: classified, its values copied, in one statement.
    INSERT INTO delay.Task (
        TaskID, TargetName, SchemaName, ProcedureName, DelaySeconds, Param1, Param2, Param3, Param4, Param5,
        TaskState, CreatedAtUtc, DueAtUtc, NextRunAtUtc, FinishedAtUtc, LastErrorNumber, LastErrorMessage, CreatedBy
    )
    OUTPUT inserted.TaskID, inserted.LastErrorNumber, inserted.NextRunAtUtc
    INTO @New (TaskID, RefusalNumber, NextRunAtUtc)
    SELECT
        i.ID, c.TargetName, c.SchemaName, c.ProcedureName, c.DelaySeconds, c.Param1, c.Param2, c.Param3, c.Param4,
        c.Param5, IIF(c.RefusalNumber IS NULL, N'Pending', N'Refused'), @Now,
        IIF(c.RefusalNumber IS NULL, DATEADD(SECOND, c.DelaySeconds, @Now), NULL),
        IIF(c.RefusalNumber IS NULL, DATEADD(SECOND, c.DelaySeconds, @Now), NULL),
        IIF(c.RefusalNumber IS NULL, NULL, @Now), c.RefusalNumber, c.RefusalMessage,
        -- The inserting session's login, whatever the context: who may cancel it.
        ORIGINAL_LOGIN()
    FROM inserted AS i
    CROSS APPLY delay.Classify(
        CAST(i.F108211 AS NVARCHAR(4000)), CAST(i.F108218 AS NVARCHAR(40)),
        i.F108212, i.F108213, i.F108214, i.F108215, i.F108216
    ) AS c
    WHERE ISNULL(i.F108219, 0) = 0 AND i.F108211 IS NOT NULL;
    INSERT INTO delay.Log (TaskID, EventName, TargetName, ErrorNumber, ErrorMessage)
    SELECT t.TaskID, N'Refused', t.TargetName, t.LastErrorNumber, t.LastErrorMessage
    FROM delay.Task AS t
    INNER JOIN @New AS n ON t.TaskID = n.TaskID
    WHERE n.RefusalNumber IS NOT NULL;
    -- By ID, never by parameter values.  An UPDATE does not fire this trigger.
    UPDATE p SET p.F108219 = 2 FROM dbo.tabDIYTable12402 AS p INNER JOIN @New AS n ON p.ID = n.TaskID
    WHERE n.RefusalNumber IS NOT NULL;
    -- The timer, only when a new task is due before it.  READCOMMITTEDLOCK: wait for a
    -- re-arming reader's row rather than read its old value (also under RCSI).
    SELECT @FirstDue = MIN(n.NextRunAtUtc) FROM @New AS n WHERE n.RefusalNumber IS NULL;
    IF @FirstDue IS NULL RETURN;
    SELECT @ArmedFor = d.ArmedForUtc FROM delay.Dispatcher AS d WITH (READCOMMITTEDLOCK) WHERE d.DispatcherId = 1;
    IF @ArmedFor IS NULL OR @FirstDue < DATEADD(SECOND, -1, @ArmedFor)
        EXEC delay.ArmDispatcher @DueAtUtc = @FirstDue;
END;
