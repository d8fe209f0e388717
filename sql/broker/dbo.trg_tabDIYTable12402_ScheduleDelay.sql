/*
dbo.trg_tabDIYTable12402_ScheduleDelay: schedules every row inserted into the
platform's table; executes nothing.
Rows:        a row whose receipt F108219 is non-zero, or whose name F108211 is
             NULL, is ignored (no bookkeeping, no conversation).
             Every other row gets a delay.Task row, written set-based:
               refused (receipt 2, a delay.Log row, never run) when the delay is
               not 0-31,536,000 s (50302), a parameter is longer than 200
               characters (50303), or the name does not resolve through
               delay.ResolveTarget (50304-50307);
               scheduled otherwise: its own dialog (BEGIN DIALOG per row: a
               conversation per task), then a conversation timer of the delay
               (chained by day above 86,400 s), or for a delay of 0 a
               DelayRequest message, which is received at once.
             A bad row never makes the INSERT fail: it is refused, and the
             other rows are scheduled.  A NULL delay counts as 0.
Transaction: the inserting statement's.  Broker operations are transactional:
             if the INSERT's transaction rolls back, no dialog, timer or message
             remains, and nothing runs.
Security:    WITH EXECUTE AS OWNER (dbo): BEGIN DIALOG needs RECEIVE on the
             queue and REFERENCES on the contract, which ownership chaining does
             not provide; the platform's own login needs only INSERT on the table.
Example:     INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108212)
             VALUES (N'TCXG', 60, N'A-1');
*/
CREATE OR ALTER TRIGGER dbo.trg_tabDIYTable12402_ScheduleDelay
ON dbo.tabDIYTable12402
WITH EXECUTE AS OWNER
AFTER INSERT
AS
BEGIN
    SET NOCOUNT ON;

    IF NOT EXISTS (SELECT 1 FROM inserted)
        RETURN;

    DECLARE
        @Now DATETIME2(3) = SYSUTCDATETIME(),
        -- 365 days; InitiateDelayExecution accepts the same range (50302).
        @MaxDelaySeconds INT = 31536000,
        -- A conversation timer never exceeds one day; dbo.ProcessDelayQueue
        -- re-arms a longer delay day by day.
        @MaxTimerSeconds INT = 86400,
        @TaskID BIGINT = NULL,
        @DelaySeconds INT,
        @Timeout INT,
        @Handle UNIQUEIDENTIFIER,
        @Body VARBINARY(8);

    DECLARE @New TABLE (
        TaskID BIGINT NOT NULL PRIMARY KEY,
        TargetName NVARCHAR(400) NULL,
        DelaySeconds INT NULL,
        RefusalNumber INT NULL,
        RefusalMessage NVARCHAR(400) NULL,
        SchemaName SYSNAME NULL,
        ProcedureName SYSNAME NULL
    );
    DECLARE @Scheduled TABLE (
        TaskID BIGINT NOT NULL PRIMARY KEY,
        ConversationHandle UNIQUEIDENTIFIER NOT NULL
    );

    -- 1. Classify every inserted row in one statement.
    WITH Candidate AS (
        SELECT
            TaskID = i.ID,
            TargetName = CAST(i.F108211 AS NVARCHAR(4000)),
            RawDelay = i.F108218,
            -- TRY_CONVERT: an adopted table may type F108218 otherwise; a value
            -- that is no integer is refused (50302) instead of failing the INSERT.
            DelaySeconds = CASE WHEN i.F108218 IS NULL THEN 0 ELSE TRY_CONVERT(INT, i.F108218) END,
            -- LEN(x + N'.') - 1: the length with trailing blanks, which LEN
            -- alone ignores; a longer value is refused, never cut to 200.
            ParameterTooLong = CASE
                WHEN
                    LEN(CAST(i.F108212 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(i.F108213 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(i.F108214 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(i.F108215 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(i.F108216 AS NVARCHAR(MAX)) + N'.') > 201
                    THEN 1
                ELSE 0
            END
        FROM inserted AS i
        WHERE
            ISNULL(i.F108219, 0) = 0
            AND i.F108211 IS NOT NULL
    )

    INSERT INTO @New (TaskID, TargetName, DelaySeconds, RefusalNumber, RefusalMessage, SchemaName, ProcedureName)
    SELECT
        c.TaskID,
        LEFT(c.TargetName, 400),
        c.DelaySeconds,
        CASE
            WHEN c.DelaySeconds IS NULL OR c.DelaySeconds NOT BETWEEN 0 AND @MaxDelaySeconds THEN 50302
            WHEN c.ParameterTooLong = 1 THEN 50303
            ELSE r.RefusalNumber
        END,
        CASE
            WHEN c.DelaySeconds IS NULL OR c.DelaySeconds NOT BETWEEN 0 AND @MaxDelaySeconds
                THEN CONCAT(N'delay F108218 = ', c.RawDelay, N' is not 0-', @MaxDelaySeconds, N' seconds')
            WHEN c.ParameterTooLong = 1
                THEN N'a parameter F108212-F108216 is longer than the target''s 200 characters'
            ELSE r.RefusalMessage
        END,
        r.SchemaName,
        r.ProcedureName
    FROM Candidate AS c
    CROSS APPLY delay.ResolveTarget(c.TargetName) AS r;

    IF NOT EXISTS (SELECT 1 FROM @New)
        RETURN;

    -- An ID used again (the platform truncated its table and the identity
    -- restarted): the old bookkeeping refers to a row that is gone.  Its
    -- conversation, if still open, finds no task and is ended when its timer
    -- fires.
    -- (Not DELETE ... OUTPUT INTO delay.Log: an OUTPUT INTO target may not
    -- have CHECK constraints.)
    INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle)
    SELECT
        t.TaskID, N'Cancelled', t.TargetName, t.Attempts, 50332,
        N'the platform row was replaced by a new row with the same ID', t.ConversationHandle
    FROM delay.Task AS t
    INNER JOIN @New AS n ON t.TaskID = n.TaskID;

    DELETE t
    FROM delay.Task AS t
    INNER JOIN @New AS n ON t.TaskID = n.TaskID;

    -- 2. Bookkeeping, set-based: every row, scheduled or refused.
    INSERT INTO delay.Task (
        TaskID, TargetName, SchemaName, ProcedureName, DelaySeconds, TaskState,
        CreatedAtUtc, DueAtUtc, NextRunAtUtc, FinishedAtUtc, LastErrorNumber, LastErrorMessage, CreatedBy
    )
    SELECT
        n.TaskID,
        n.TargetName,
        n.SchemaName,
        n.ProcedureName,
        n.DelaySeconds,
        IIF(n.RefusalNumber IS NULL, N'Scheduled', N'Refused'),
        @Now,
        IIF(n.RefusalNumber IS NULL, DATEADD(SECOND, n.DelaySeconds, @Now), NULL),
        IIF(n.RefusalNumber IS NULL, DATEADD(SECOND, n.DelaySeconds, @Now), NULL),
        IIF(n.RefusalNumber IS NULL, NULL, @Now),
        n.RefusalNumber,
        n.RefusalMessage,
        -- The inserting session's login, whatever EXECUTE AS says: the owner
        -- of the task for dbo.CancelDelayExecution.
        ORIGINAL_LOGIN()
    FROM @New AS n;

    INSERT INTO delay.Log (TaskID, EventName, TargetName, ErrorNumber, ErrorMessage)
    SELECT n.TaskID, N'Refused', n.TargetName, n.RefusalNumber, n.RefusalMessage
    FROM @New AS n
    WHERE n.RefusalNumber IS NOT NULL;

    -- By ID: never by parameter values.  An UPDATE does not fire this
    -- AFTER INSERT trigger again.
    UPDATE p
    SET F108219 = 2
    FROM dbo.tabDIYTable12402 AS p
    INNER JOIN @New AS n ON p.ID = n.TaskID
    WHERE n.RefusalNumber IS NOT NULL;

    -- 3. One conversation per scheduled row: BEGIN DIALOG has no set form.
    WHILE 1 = 1
    BEGIN
        SELECT TOP (1)
            @TaskID = n.TaskID,
            @DelaySeconds = n.DelaySeconds
        FROM @New AS n
        WHERE n.RefusalNumber IS NULL AND (@TaskID IS NULL OR n.TaskID > @TaskID)
        ORDER BY n.TaskID;

        IF @@ROWCOUNT = 0
            BREAK;

        BEGIN DIALOG CONVERSATION @Handle
            FROM SERVICE MailqDelayService
            TO SERVICE N'MailqDelayService', N'CURRENT DATABASE'
            ON CONTRACT MailqDelayContract
            WITH ENCRYPTION = OFF;

        IF @DelaySeconds = 0
        BEGIN
            -- No timer for 0: a message on the dialog is received at once.
            SET @Body = CAST(@TaskID AS BINARY(8));
            SEND ON CONVERSATION @Handle
                MESSAGE TYPE MailqDelayRequest (@Body);
        END;
        ELSE
        BEGIN
            SET @Timeout = IIF(@DelaySeconds > @MaxTimerSeconds, @MaxTimerSeconds, @DelaySeconds);
            BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
        END;

        INSERT INTO @Scheduled (TaskID, ConversationHandle) VALUES (@TaskID, @Handle);
    END;

    UPDATE t
    SET ConversationHandle = s.ConversationHandle
    FROM delay.Task AS t
    INNER JOIN @Scheduled AS s ON t.TaskID = s.TaskID;
END;
