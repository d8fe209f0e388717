/*
mailq.RunApplicationHooks: the hook dispatcher (docs/hooks.md).  For each
application with a hook (mailq.ApplicationHook), reads its events after the
stored cursor with mailq.GetMailEvents' commit-safe bound (only rows below
MIN_ACTIVE_ROWVERSION(), read with READCOMMITTEDLOCK after the bound), and
calls the hook once per event, in EventID order, each call in its OWN
transaction:
  BEGIN TRANSACTION; EXEC the hook (sp_executesql, parameters by name);
  @StopMail = 1 on a mail still UnSent or Sending: EXEC mailq.StopMail
  (TinyMail's stop(); on a mail already final nothing happens); advance the
  cursor; COMMIT.  The cursor moves in the same transaction as the hook's
  work: a call is either wholly done and passed, or wholly undone.
Failures (TRY/CATCH around the EXEC; the hook is a lower execution level,
so even its compile and name-resolution errors reach our CATCH; TRY...CATCH
(Transact-SQL), "Errors unaffected by a TRY...CATCH construct":
https://learn.microsoft.com/sql/t-sql/language-elements/try-catch-transact-sql):
  - the hook throws, or dooms the transaction (XACT_STATE() = -1, e.g. any
    error under its own XACT_ABORT ON): everything is rolled back (a doomed
    transaction "can only request a full rollback", XACT_STATE (Transact-SQL),
    https://learn.microsoft.com/sql/t-sql/functions/xact-state-transact-sql);
    the failure is counted (FailingEventID/FailCount) in a transaction of its
    own and the application waits for the next run; after MaxAttempts failed
    calls of the same event it is written to mailq.ApplicationHookFailure and
    the cursor moves past it (poison-proof: one bad event never stops the
    later ones);
  - the hook leaves a transaction of its own open: SQL Server raises 266 at
    its return ("@@TRANCOUNT has a different value when a stored procedure
    finishes than it had when the procedure was executed", Rollbacks and
    commits in stored procedures and triggers,
    https://learn.microsoft.com/previous-versions/sql/sql-server-2008-r2/ms187844(v=sql.105));
    all of it is rolled back and counted as a failed call;
  - the hook commits or rolls back the transaction opened for it (266 with
    no transaction left): its work may be committed, so it is not called
    again: recorded in mailq.ApplicationHookFailure at once, cursor moved.
  - a hook waits on a lock longer than 5 s: error 1222 (SET LOCK_TIMEOUT
    5000 for the hook's batch; a SET in a batch run by sp_executesql reverts
    when it returns), a failed call like any other.
A hook whose procedure was altered, dropped or recreated since it was
registered is suspended: not called, cursor kept, LastError says why, until
mailq.SetApplicationHook re-registers it.  The pin is checked before every
call, not once per run, so a change during a run stops the next call.
Never inside an acknowledging transaction: it refuses to run inside any open
transaction (50296), so no worker's MarkSent/MarkFailed/FinalizeMail can wait
on a hook, and a hook's failure cannot undo an acknowledgement.  The events
it reads are committed already; it never locks queue rows except the one
mail a hook stops (through mailq.StopMail, briefly).
One dispatcher at a time: a session-owned application lock
(N'mailq.RunApplicationHooks', timeout 0); a second caller returns at once
with State 'Busy'.
Security:    EXECUTE AS OWNER: hooks run as dbo (that is why only db_owner
             registers them, in dbo-owned schemas, pinned).  Granted to
             MailqAdmin (an Agent or elastic job runs it on Azure SQL
             Database; the delayed-execution dispatcher elsewhere).
Parameters:  @MaxEvents INT = 500: hook calls in this run, all applications
             together (1-5000); @Quiet BIT = 0: 1 returns no result set (the
             delayed-execution task).
Result set:  (unless @Quiet = 1) one row per hooked application: AppName,
             HookProcedure, Calls INT (hook calls made), Succeeded INT,
             FailedCalls INT, GivenUp INT (events written to
             mailq.ApplicationHookFailure), CursorEventID BIGINT, State
             NVARCHAR(16): UpToDate | More (its share of @MaxEvents, an equal
             part per hooked application, or the budget used up) | Retrying (a
             failed call waits for the next run) | Suspended (hook changed or
             gone) | Moved (the hook was re-registered meanwhile); or one row
             with AppName NULL and State 'Busy'.
Errors:      50295 @MaxEvents outside 1-5000; 50296 called inside an open
             transaction.  50297 (the hook changed the transaction count) is
             recorded as that call's error, never raised.  A hook's errors are never re-raised: they are
             recorded (LastError, mailq.ApplicationHookFailure).
Transaction: none open on entry (50296); one transaction per hook call
             (hook + StopMail + cursor), one per failure record; never one
             around two calls.  A batch procedure: it refuses a caller's
             transaction, as PurgeMail does.
Isolation:   sets READ COMMITTED itself; events read with READCOMMITTEDLOCK
             below the bound read first (see mailq.GetMailEvents).
Lock order:  per call: whatever the hook locks, then mailq.MailQueue (the
             stopped mail, through StopMail: MailQueue, MailEvent,
             MailAttempt), then mailq.ApplicationHook (the application's
             row); failure records: mailq.ApplicationHookFailure, then
             mailq.ApplicationHook.
Plan:        per application one range seek on IX_MailEvent_AppName between
             the cursor and the bound, TOP (remaining budget): the same cost
             at any event-table size; mailq.ApplicationHook by its key.
Example:     EXEC mailq.RunApplicationHooks @MaxEvents = 500;
*/
CREATE OR ALTER PROCEDURE mailq.RunApplicationHooks
    @MaxEvents INT = 500,
    @Quiet BIT = 0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    SET @MaxEvents = COALESCE(@MaxEvents, 500);
    IF @MaxEvents NOT BETWEEN 1 AND 5000
    BEGIN
        SET @Msg = CONCAT(N'@MaxEvents must be 1-5000; got ', @MaxEvents, N'.');
        THROW 50295, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50296,
            N'mailq.RunApplicationHooks runs each hook call in its own transaction: call it outside any transaction.',
            1;

    DECLARE @Summary TABLE (
        AppName NVARCHAR(128) NOT NULL PRIMARY KEY,
        HookProcedure NVARCHAR(300) NOT NULL,
        Calls INT NOT NULL DEFAULT (0),
        Succeeded INT NOT NULL DEFAULT (0),
        FailedCalls INT NOT NULL DEFAULT (0),
        GivenUp INT NOT NULL DEFAULT (0),
        CursorEventID BIGINT NOT NULL,
        State NVARCHAR(16) NOT NULL DEFAULT (N'UpToDate')
    );
    DECLARE @Page TABLE (
        EventID BIGINT NOT NULL PRIMARY KEY,
        MailID BIGINT NOT NULL,
        EventType NVARCHAR(32) NOT NULL,
        Status NVARCHAR(16) NOT NULL,
        SmtpCode INT NULL,
        Detail NVARCHAR(4000) NULL
    );
    DECLARE
        @LockResult INT,
        @Budget INT = @MaxEvents,
        @App NVARCHAR(128) = N'',
        @SchemaName SYSNAME,
        @ProcedureName SYSNAME,
        @ObjectId INT,
        @DefinitionHash VARBINARY(32),
        @Hook NVARCHAR(300),
        @Cursor BIGINT,
        @FailingEventID BIGINT,
        @FailCount INT,
        @MaxAttempts INT,
        @Upper BINARY(8),
        @EventID BIGINT,
        @MailID BIGINT,
        @EventType NVARCHAR(32),
        @Status NVARCHAR(16),
        @SmtpCode INT,
        @Detail NVARCHAR(4000),
        @StopMail BIT,
        @StopReason NVARCHAR(4000),
        @MailStatus NVARCHAR(16),
        @Sql NVARCHAR(MAX),
        @ErrorNumber INT,
        @ErrorMessage NVARCHAR(4000),
        @TranCountInCatch INT,
        @Attempts INT,
        @GiveUp BIT,
        @Moved BIT,
        @AppState NVARCHAR(16),
        @PerApp INT,
        @AppCalls INT,
        @Now DATETIME2(3);
    DECLARE @Stopped TABLE (ID BIGINT, Status NVARCHAR(16), NextAttemptUtc DATETIME2(3));
    DECLARE @ParameterList NVARCHAR(400) = N'@EventID BIGINT, @MailID BIGINT, @AppName NVARCHAR(128), '
        + N'@EventType NVARCHAR(32), @Status NVARCHAR(16), @SmtpCode INT, @Detail NVARCHAR(4000), '
        + N'@StopMail BIT OUTPUT, @StopReason NVARCHAR(4000) OUTPUT';

    -- One dispatcher at a time (an Agent job and the delayed-execution task
    -- may overlap): session-owned, so it spans the per-call transactions.
    EXEC @LockResult = sys.sp_getapplock
        @Resource = N'mailq.RunApplicationHooks',
        @LockMode = N'Exclusive',
        @LockOwner = N'Session',
        @LockTimeout = 0;
    IF @LockResult < 0
    BEGIN
        IF @Quiet = 0
            SELECT
                CAST(NULL AS NVARCHAR(128)) AS AppName,
                CAST(NULL AS NVARCHAR(300)) AS HookProcedure,
                0 AS Calls, 0 AS Succeeded, 0 AS FailedCalls, 0 AS GivenUp,
                CAST(NULL AS BIGINT) AS CursorEventID,
                N'Busy' AS State;
        RETURN;
    END;

    BEGIN TRY
        -- Each application gets an equal share of the budget, so one with a
        -- long backlog does not starve the others (needs @MaxEvents >= the
        -- number of hooked applications to reach them all in one run).
        SET @PerApp = (SELECT CEILING(@MaxEvents * 1.0 / NULLIF(COUNT(*), 0)) FROM mailq.ApplicationHook);
        WHILE @Budget > 0
        BEGIN
            -- Next hooked application, by key (a seek per application).
            SET @SchemaName = NULL;
            SELECT TOP (1)
                @App = h.AppName,
                @SchemaName = h.SchemaName,
                @ProcedureName = h.ProcedureName,
                @ObjectId = h.ObjectId,
                @DefinitionHash = h.DefinitionHash,
                @Cursor = h.CursorEventID,
                @FailingEventID = h.FailingEventID,
                @FailCount = h.FailCount,
                @MaxAttempts = h.MaxAttempts
            FROM mailq.ApplicationHook AS h
            WHERE h.AppName > @App
            ORDER BY h.AppName ASC;
            IF @SchemaName IS NULL BREAK;

            SET @Hook = CONCAT(QUOTENAME(@SchemaName), N'.', QUOTENAME(@ProcedureName));
            SELECT @AppState = N'UpToDate', @AppCalls = 0;
            INSERT INTO @Summary (AppName, HookProcedure, CursorEventID) VALUES (@App, @Hook, @Cursor);

            -- The pin: same object, same schema and name, same definition.
            IF NOT EXISTS (
                SELECT 1
                FROM sys.objects AS o
                INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
                WHERE
                    o.object_id = @ObjectId AND o.type = 'P'
                    AND s.name = @SchemaName AND o.name = @ProcedureName
                    AND s.principal_id = 1 AND COALESCE(o.principal_id, 1) = 1
            )
                OR HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId)) IS NULL
                OR HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId)) <> @DefinitionHash
            BEGIN
                UPDATE h
                SET
                    h.LastError = CONCAT(
                        N'Suspended: ', @Hook, N' was altered, dropped, recreated, renamed or changed owner since ',
                        N'it was registered; review it and run mailq.SetApplicationHook again.'
                    ),
                    h.LastRunAtUtc = SYSUTCDATETIME()
                FROM mailq.ApplicationHook AS h
                WHERE h.AppName = @App;
                UPDATE @Summary SET State = N'Suspended' WHERE AppName = @App;
                CONTINUE;
            END;

            -- QUOTENAMEd catalog names; the values are parameters, never text.
            SET @Sql = CONCAT(
                N'SET LOCK_TIMEOUT 5000; EXEC ', @Hook,
                N' @EventID = @EventID, @MailID = @MailID, @AppName = @AppName, @EventType = @EventType,',
                N' @Status = @Status, @SmtpCode = @SmtpCode, @Detail = @Detail,',
                N' @StopMail = @StopMail OUTPUT, @StopReason = @StopReason OUTPUT;'
            );

            -- The page: mailq.GetMailEvents' commit-safe read (bound first,
            -- then a locking read below it; see its header).
            DELETE FROM @Page;
            SET @Upper = MIN_ACTIVE_ROWVERSION();
            INSERT INTO @Page (EventID, MailID, EventType, Status, SmtpCode, Detail)
            SELECT TOP (IIF(@PerApp < @Budget, @PerApp, @Budget))
                CAST(e.EventSeq AS BIGINT),
                e.MailID,
                e.EventType,
                e.Status,
                e.SmtpCode,
                e.Detail
            FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_AppName), FORCESEEK, READCOMMITTEDLOCK)
            WHERE e.AppName = @App AND e.EventSeq > CAST(@Cursor AS BINARY(8)) AND e.EventSeq < @Upper
            ORDER BY e.EventSeq ASC;

            WHILE @Budget > 0 AND @AppCalls < @PerApp
            BEGIN
                SELECT TOP (1)
                    @EventID = p.EventID,
                    @MailID = p.MailID,
                    @EventType = p.EventType,
                    @Status = p.Status,
                    @SmtpCode = p.SmtpCode,
                    @Detail = p.Detail
                FROM @Page AS p
                WHERE p.EventID > @Cursor
                ORDER BY p.EventID ASC;
                IF @@ROWCOUNT = 0 BREAK;

                -- The pin again before every call (as delay.ResolveTarget at
                -- each run): a hook altered, renamed, dropped or recreated
                -- during this run is not called again in it.
                IF NOT EXISTS (
                    SELECT 1
                    FROM sys.objects AS o
                    INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
                    WHERE
                        o.object_id = @ObjectId AND o.type = 'P'
                        AND s.name = @SchemaName AND o.name = @ProcedureName
                        AND s.principal_id = 1 AND COALESCE(o.principal_id, 1) = 1
                )
                    OR HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId)) IS NULL
                    OR HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId)) <> @DefinitionHash
                BEGIN
                    UPDATE h
                    SET
                        h.LastError = CONCAT(
                            N'Suspended: ', @Hook, N' was altered, dropped, recreated, renamed or changed owner since ',
                            N'it was registered; review it and run mailq.SetApplicationHook again.'
                        ),
                        h.LastRunAtUtc = SYSUTCDATETIME()
                    FROM mailq.ApplicationHook AS h
                    WHERE h.AppName = @App;
                    UPDATE @Summary SET State = N'Suspended' WHERE AppName = @App;
                    SET @AppState = N'Suspended';
                    BREAK;
                END;

                SELECT
                    @Budget -= 1,
                    @AppCalls += 1,
                    @StopMail = 0,
                    @StopReason = NULL,
                    @ErrorNumber = NULL,
                    @ErrorMessage = NULL,
                    @TranCountInCatch = NULL,
                    @Moved = 0,
                    @GiveUp = 0;
                UPDATE @Summary SET Calls += 1 WHERE AppName = @App;

                -- 1. The call, its stop and the cursor: one transaction.
                BEGIN TRY
                    BEGIN TRANSACTION;

                    EXEC sys.sp_executesql
                        @Sql,
                        @ParameterList,
                        @EventID = @EventID,
                        @MailID = @MailID,
                        @AppName = @App,
                        @EventType = @EventType,
                        @Status = @Status,
                        @SmtpCode = @SmtpCode,
                        @Detail = @Detail,
                        @StopMail = @StopMail OUTPUT,
                        @StopReason = @StopReason OUTPUT;

                    -- 266 normally comes first; a count that still differs is the same fault.
                    IF @@TRANCOUNT <> 1
                        THROW 50297,
                            N'The hook ended the transaction opened for it or left one of its own open.',
                            1;

                    IF @StopMail = 1
                    BEGIN
                        -- Only a mail not yet final: StopMail would refuse a
                        -- final one (50260).  UPDLOCK: StopMail takes the same
                        -- row's U lock next, in this transaction.
                        SET @MailStatus = NULL;
                        SELECT @MailStatus = q.Status
                        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
                        WHERE q.ID = @MailID;
                        IF @MailStatus IN (N'UnSent', N'Sending')
                        BEGIN
                            SET @StopReason = COALESCE(
                                NULLIF(LTRIM(RTRIM(@StopReason)), N''),
                                CONCAT(
                                    N'Stopped by the hook ', @Hook, N' on event ', @EventID, N' (', @EventType, N').'
                                )
                            );
                            -- StopMail's one-row result is kept here, not sent to our caller.
                            DELETE FROM @Stopped;
                            INSERT INTO @Stopped (ID, Status, NextAttemptUtc)
                            EXEC mailq.StopMail @MailID = @MailID, @Reason = @StopReason;
                        END;
                    END;

                    -- The cursor, guarded: a re-registration with a new
                    -- cursor meanwhile (SetApplicationHook @ResetCursorTo)
                    -- undoes this call instead of overwriting it.
                    UPDATE h
                    SET
                        h.CursorEventID = @EventID,
                        h.FailingEventID = NULL,
                        h.FailCount = 0,
                        h.LastError = NULL,
                        h.LastRunAtUtc = SYSUTCDATETIME()
                    FROM mailq.ApplicationHook AS h
                    WHERE h.AppName = @App AND h.CursorEventID = @Cursor AND h.ObjectId = @ObjectId;
                    IF @@ROWCOUNT = 0
                    BEGIN
                        SET @Moved = 1;
                        ROLLBACK TRANSACTION;
                    END;
                    ELSE
                        COMMIT TRANSACTION;
                END TRY
                BEGIN CATCH
                    SELECT
                        @ErrorNumber = ERROR_NUMBER(),
                        @ErrorMessage = LEFT(ERROR_MESSAGE(), 4000),
                        @TranCountInCatch = @@TRANCOUNT;
                    -- Doomed (-1) or not (1): the call is undone as a whole.
                    IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
                END CATCH;

                IF @Moved = 1
                BEGIN
                    UPDATE @Summary SET State = N'Moved' WHERE AppName = @App;
                    SET @AppState = N'Moved';
                    BREAK;
                END;

                IF @ErrorNumber IS NULL
                BEGIN
                    SET @Cursor = @EventID;
                    SELECT @FailingEventID = NULL, @FailCount = 0;
                    UPDATE @Summary SET Succeeded += 1, CursorEventID = @EventID WHERE AppName = @App;
                    CONTINUE;
                END;

                -- 2. A failed call: count it, or give the event up.
                SET @Attempts = IIF(@FailingEventID = @EventID, @FailCount, 0) + 1;
                -- 266 with no transaction left: the hook ended the
                -- transaction opened for it; its work may be committed.
                IF @ErrorNumber = 266 AND @TranCountInCatch = 0 SET @GiveUp = 1;
                IF @Attempts >= @MaxAttempts SET @GiveUp = 1;
                SET @ErrorMessage = LEFT(CONCAT(
                    N'Event ', @EventID, N' (', @EventType, N', mail ', @MailID, N'), call ', @Attempts,
                    N' of ', @MaxAttempts, N': error ', @ErrorNumber, N': ', @ErrorMessage
                ), 4000);
                SET @Now = SYSUTCDATETIME();
                UPDATE @Summary SET FailedCalls += 1 WHERE AppName = @App;

                BEGIN TRANSACTION;
                IF @GiveUp = 1
                    INSERT INTO mailq.ApplicationHookFailure (
                        AppName, EventID, MailID, EventType, HookProcedure, Attempts, ErrorNumber, ErrorMessage
                    )
                    VALUES (@App, @EventID, @MailID, @EventType, @Hook, @Attempts, @ErrorNumber, @ErrorMessage);
                UPDATE h
                SET
                    h.CursorEventID = IIF(@GiveUp = 1, @EventID, h.CursorEventID),
                    h.FailingEventID = IIF(@GiveUp = 1, NULL, @EventID),
                    h.FailCount = IIF(@GiveUp = 1, 0, @Attempts),
                    h.LastError = @ErrorMessage,
                    h.LastRunAtUtc = @Now
                FROM mailq.ApplicationHook AS h
                WHERE h.AppName = @App AND h.CursorEventID = @Cursor AND h.ObjectId = @ObjectId;
                IF @@ROWCOUNT = 0
                BEGIN
                    ROLLBACK TRANSACTION;
                    UPDATE @Summary SET State = N'Moved' WHERE AppName = @App;
                    SET @AppState = N'Moved';
                    BREAK;
                END;
                COMMIT TRANSACTION;

                IF @GiveUp = 1
                BEGIN
                    SET @Cursor = @EventID;
                    SELECT @FailingEventID = NULL, @FailCount = 0;
                    UPDATE @Summary SET GivenUp += 1, CursorEventID = @EventID WHERE AppName = @App;
                    CONTINUE;
                END;

                -- Retry on a later run (the interval between runs is the backoff).
                UPDATE @Summary SET State = N'Retrying' WHERE AppName = @App;
                SET @AppState = N'Retrying';
                BREAK;
            END;

            IF @AppState = N'UpToDate'
            BEGIN
                -- Nothing called (or every call passed): note the run.
                UPDATE h
                SET h.LastRunAtUtc = SYSUTCDATETIME()
                FROM mailq.ApplicationHook AS h
                WHERE h.AppName = @App AND h.ObjectId = @ObjectId;
                -- The share or the budget used up: there may be more.
                IF @AppCalls >= @PerApp OR @Budget = 0
                    UPDATE @Summary SET State = N'More' WHERE AppName = @App AND Calls > 0;
            END;
        END;

        EXEC sys.sp_releaseapplock @Resource = N'mailq.RunApplicationHooks', @LockOwner = N'Session';
    END TRY
    BEGIN CATCH
        -- Our own bookkeeping failed (never a hook's error: those are caught
        -- above).  Nothing half-done stays: roll back, release, re-raise.
        IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        IF APPLOCK_MODE(N'public', N'mailq.RunApplicationHooks', N'Session') = N'Exclusive'
            EXEC sys.sp_releaseapplock @Resource = N'mailq.RunApplicationHooks', @LockOwner = N'Session';
        THROW;
    END CATCH;

    IF @Quiet = 0
        SELECT
            s.AppName,
            s.HookProcedure,
            s.Calls,
            s.Succeeded,
            s.FailedCalls,
            s.GivenUp,
            s.CursorEventID,
            s.State
        FROM @Summary AS s
        ORDER BY s.AppName;
END;
