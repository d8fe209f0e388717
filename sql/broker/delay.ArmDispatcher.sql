/*
delay.ArmDispatcher: sets the dispatcher's conversation timer, first beginning
the dispatcher's self-dialog when there is none or it ended (NEW_BROKER,
ERROR_BROKER_CONVERSATIONS, END CONVERSATION).
Parameters:  @DueAtUtc DATETIME2(3) = NULL: an inserter's (or a release's) earliest due
                 time: the timer moves to the earliest pending time, never later (BEGIN
                 CONVERSATION TIMER replaces a timer).  NULL: a reader's end of pass: the
                 earliest of the first Pending task, hook run, claim lease, now + TickSeconds
             @Armed BIT OUTPUT: 1 set; 0 a lock was not granted in time
             @NextDueUtc DATETIME2(3) OUTPUT: the first Pending task's due time
Protocol:    docs/delayed-execution.md "One timer", models/delayexec.pml: a reader
             writes delay.Dispatcher, then reads the due index with locks; an
             inserter inserts, then reads delay.Dispatcher: one always sees the other.
             A reader waits at most 200 ms for a lock, then polls (@Armed = 0); an
             inserter waits at most 2 s for the arm lock, else leaves it to the tick.
Errors:      an inserter's are swallowed (XACT_ABORT OFF there: never fails the INSERT);
             a reader's other than 1205/1222 are re-raised.  Transaction: an inserter's
             (held to its commit); a reader's own.
Lock order:  the arm lock (applock), delay.Dispatcher, delay.Task, the conversation group.
Security:    EXECUTE AS OWNER (timers and dialogs need dbo); granted to nobody.
Example:     EXEC delay.ArmDispatcher @Armed = @Armed OUTPUT, @NextDueUtc = @Next OUTPUT;
*/
CREATE OR ALTER PROCEDURE delay.ArmDispatcher
    @DueAtUtc DATETIME2(3) = NULL,
    @Armed BIT = NULL OUTPUT,
    @NextDueUtc DATETIME2(3) = NULL OUTPUT
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE
        @Now DATETIME2(3) = SYSUTCDATETIME(), @Reader BIT = IIF(@DueAtUtc IS NULL, 1, 0),
        @Handle UNIQUEIDENTIFIER, @ArmedFor DATETIME2(3), @Fire DATETIME2(3), @Tick INT = 60, @Wait INT = 2000,
        @Lock INT, @Timeout INT, @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    SELECT @Armed = 0, @NextDueUtc = NULL;
    SELECT @Tick = s.TickSeconds FROM delay.Setting AS s WHERE s.SettingId = 1;
    IF @Reader = 1
    BEGIN
        -- A reader never waits long on an inserter: it yields and polls, the victim of any deadlock.
        SET LOCK_TIMEOUT 200;
        SET DEADLOCK_PRIORITY LOW;
        SET @Wait = 200;
    END;
    ELSE
        SET XACT_ABORT OFF;   -- statement errors stay statement errors: nothing here fails the INSERT
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC @Lock = sys.sp_getapplock
            @Resource = N'mailq-db/delay/arm', @LockMode = N'Exclusive', @LockOwner = N'Transaction',
            @LockTimeout = @Wait;
        IF @Lock >= 0
        BEGIN
            -- The reader writes the row first; inserters read it after inserting.
            IF @Reader = 1
                UPDATE d SET d.LastWokenAtUtc = @Now FROM delay.Dispatcher AS d WHERE d.DispatcherId = 1;
            SELECT @Handle = d.ConversationHandle, @ArmedFor = d.ArmedForUtc FROM delay.Dispatcher AS d
            WHERE d.DispatcherId = 1;
            -- A reader: READCOMMITTEDLOCK waits (200 ms at most) for an uncommitted row that may
            -- come first, also under READ_COMMITTED_SNAPSHOT.  An inserter: READPAST, never waits.
            IF @Reader = 1
                SELECT TOP (1) @NextDueUtc = t.NextRunAtUtc
                FROM delay.Task AS t WITH (READCOMMITTEDLOCK, INDEX (IX_Task_Due))
                WHERE t.TaskState = N'Pending' ORDER BY t.NextRunAtUtc;
            ELSE
                SELECT TOP (1) @NextDueUtc = t.NextRunAtUtc
                FROM delay.Task AS t WITH (READPAST, INDEX (IX_Task_Due))
                WHERE t.TaskState = N'Pending' ORDER BY t.NextRunAtUtc;
            -- Earlier than needed is always safe: a reader then finds nothing due.
            SELECT @Fire = MIN(x.At)
            FROM (
                VALUES (@NextDueUtc), (@DueAtUtc), (IIF(@Reader = 1, DATEADD(SECOND, @Tick, @Now), @ArmedFor)),
                ((SELECT MIN(t.LeaseUntilUtc) FROM delay.Task AS t WITH (READPAST) WHERE t.TaskState = N'Claimed')),
                ((SELECT h.NextRunAtUtc FROM mailq.HookDispatcher AS h WHERE h.Singleton = 1 AND h.Enabled = 1))
            ) AS x(At);
            IF @Handle IS NULL OR NOT EXISTS (
                SELECT 1 FROM sys.conversation_endpoints AS e
                WHERE e.conversation_handle = @Handle AND e.state IN ('SO', 'SI', 'CO')
            )
            BEGIN
                BEGIN DIALOG CONVERSATION @Handle FROM SERVICE MailqDelayService
                    TO SERVICE N'MailqDelayService', N'CURRENT DATABASE'
                    ON CONTRACT MailqDelayContract WITH ENCRYPTION = OFF;
                UPDATE d SET d.ConversationHandle = @Handle FROM delay.Dispatcher AS d WHERE d.DispatcherId = 1;
                INSERT INTO delay.Log (EventName, ErrorMessage)
                VALUES (N'Dispatcher', CONCAT(N'dispatcher conversation begun: ', @Handle));
            END;
            -- Whole seconds, 1 s at least (0 is not documented), one day at most.
            SET @Timeout = CAST(CASE
                WHEN @Fire <= @Now THEN 1
                WHEN @Fire >= DATEADD(SECOND, 86400, @Now) THEN 86400
                ELSE (DATEDIFF_BIG(MILLISECOND, @Now, @Fire) + 999) / 1000
            END AS INT);
            BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
            IF @Reader = 1
                UPDATE d SET d.ArmedForUtc = DATEADD(SECOND, @Timeout, @Now), d.LastArmedAtUtc = @Now
                FROM delay.Dispatcher AS d WHERE d.DispatcherId = 1;
            SET @Armed = 1;
        END;
        IF @OwnTran = 1 AND XACT_STATE() = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        SET @Armed = 0;
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        IF @Reader = 1 AND ERROR_NUMBER() NOT IN (1205, 1222) THROW;
    END CATCH;
END;
