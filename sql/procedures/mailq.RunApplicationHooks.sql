/*
mailq.RunApplicationHooks: the hook dispatcher (docs/hooks.md): calls each hooked
application's hook once per committed event after its cursor, in EventID order, as
MailqRunner, each call in its own transaction with its @StopMail and the cursor
move; an equal share of @MaxEvents per application; one dispatcher at a time.  A
hook no longer pinned (mailq.HookPin) is suspended; a failing call is retried on
later runs, then recorded in mailq.ApplicationHookFailure and skipped.
Parameters:  @MaxEvents INT = 500 (1-5000); @Quiet BIT = 0 (1: no result set)
Result set:  one row per hooked application: AppName, HookProcedure, Calls,
             Succeeded, FailedCalls, GivenUp, CursorEventID, State (UpToDate | More |
             Retrying | Suspended | Moved); or one row, AppName NULL, State 'Busy'.
Errors:      50295 @MaxEvents outside 1-5000; 50296 called inside a transaction;
             50297 (caught, counted) the hook ended or left open a transaction.
Transaction: none open on entry; one per hook call, one per failure record.
Isolation:   READ COMMITTED; events read with READCOMMITTEDLOCK below the bound.
Lock order:  per call: the hook's, mailq.MailQueue (StopMail), mailq.ApplicationHook;
             failures: ApplicationHookFailure, ApplicationHook.
Security:    EXECUTE AS OWNER; the hook runs as MailqRunner.  Granted to MailqAdmin.
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
        @Modified DATETIME,
        @Changed BIT,
        @Attempts INT,
        @GiveUp BIT,
        @Moved BIT,
        @AppState NVARCHAR(16),
        @PerApp INT,
        @AppCalls INT,
        @Now DATETIME2(3),
        @Suspend NVARCHAR(200),
        @NotPinned NVARCHAR(200) = CONCAT(
            N' was altered, dropped, recreated, renamed or changed owner since ',
            N'it was registered; review it and run mailq.SetApplicationHook again.'
        );
    DECLARE @Stopped TABLE (ID BIGINT, Status NVARCHAR(16), NextAttemptUtc DATETIME2(3));
    DECLARE @ParameterList NVARCHAR(400) = N'@EventID BIGINT, @MailID BIGINT, @AppName NVARCHAR(128), '
        + N'@EventType NVARCHAR(32), @Status NVARCHAR(16), @SmtpCode INT, @Detail NVARCHAR(4000), '
        + N'@StopMail BIT OUTPUT, @StopReason NVARCHAR(4000) OUTPUT';
    -- Session-owned: it spans the per-call transactions.
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
        SET @PerApp = (SELECT CEILING(@MaxEvents * 1.0 / NULLIF(COUNT(*), 0)) FROM mailq.ApplicationHook);
        WHILE @Budget > 0
        BEGIN
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
            SELECT @AppState = N'UpToDate', @AppCalls = 0, @Suspend = NULL;
            INSERT INTO @Summary (AppName, HookProcedure, CursorEventID) VALUES (@App, @Hook, @Cursor);
            IF NOT EXISTS (SELECT 1 FROM mailq.HookPin(@ObjectId, @SchemaName, @ProcedureName, @DefinitionHash))
                SET @Suspend = @NotPinned;
            ELSE
            BEGIN
                -- QUOTENAMEd catalog names; the values are parameters, never text.
                SET @Sql = CONCAT(
                    N'SET ANSI_NULLS, ANSI_WARNINGS, ANSI_PADDING, QUOTED_IDENTIFIER, ARITHABORT, ',
                    N'CONCAT_NULL_YIELDS_NULL ON; SET NUMERIC_ROUNDABORT OFF; SET XACT_ABORT OFF; ',
                    N'SET DEADLOCK_PRIORITY NORMAL; SET LOCK_TIMEOUT 5000; EXEC ', @Hook,
                    N' @EventID = @EventID, @MailID = @MailID, @AppName = @AppName, @EventType = @EventType,',
                    N' @Status = @Status, @SmtpCode = @SmtpCode, @Detail = @Detail,',
                    N' @StopMail = @StopMail OUTPUT, @StopReason = @StopReason OUTPUT;'
                );
                -- GetMailEvents' commit-safe read: bound first, then a locking read below it.
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
                    -- The pin again before every call: an altered hook is not called again.
                    SET @Modified = NULL;
                    SELECT @Modified = p.ModifyDate
                    FROM mailq.HookPin(@ObjectId, @SchemaName, @ProcedureName, @DefinitionHash) AS p;
                    IF @Modified IS NULL
                    BEGIN
                        SET @Suspend = @NotPinned;
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
                    -- 1. Call, stop and cursor in one transaction.  REVERT in a module undoes only
                    --    its own EXECUTE AS: the hook cannot keep or undo ours.
                    SET @Changed = 0;
                    BEGIN TRANSACTION;
                    EXECUTE AS USER = N'MailqRunner';
                    BEGIN TRY
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
                    END TRY
                    BEGIN CATCH
                        SELECT
                            @ErrorNumber = ERROR_NUMBER(),
                            @ErrorMessage = LEFT(ERROR_MESSAGE(), 4000),
                            @TranCountInCatch = @@TRANCOUNT;
                    END CATCH;
                    REVERT;
                    IF @ErrorNumber IS NULL
                    BEGIN
                        BEGIN TRY
                            -- 266 normally comes first; a count that still differs is the same fault.
                            IF @@TRANCOUNT <> 1
                                THROW 50297,
                                    N'The hook ended the transaction opened for it or left one of its own open.',
                                    1;
                            -- The code that ran is the code that was checked (same ModifyDate).
                            IF NOT EXISTS (
                                SELECT 1
                                FROM mailq.HookPin(@ObjectId, @SchemaName, @ProcedureName, @DefinitionHash) AS p
                                WHERE p.ModifyDate = @Modified
                            )
                            BEGIN
                                SET @Changed = 1;
                                ROLLBACK TRANSACTION;
                            END;
                            IF @Changed = 0 AND @StopMail = 1
                            BEGIN
                                -- Only a mail not yet final (StopMail refuses one, 50260).  UPDLOCK: StopMail
                                -- takes this row's U lock next.
                                SET @MailStatus = NULL;
                                SELECT @MailStatus = q.Status
                                FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
                                WHERE q.ID = @MailID;
                                IF @MailStatus IN (N'UnSent', N'Sending')
                                BEGIN
                                    SET @StopReason = COALESCE(
                                        NULLIF(LTRIM(RTRIM(@StopReason)), N''),
                                        CONCAT(
                                            N'Stopped by the hook ', @Hook, N' on event ', @EventID,
                                            N' (', @EventType, N').'
                                        )
                                    );
                                    -- StopMail's one-row result is kept here, not sent to our caller.
                                    DELETE FROM @Stopped;
                                    INSERT INTO @Stopped (ID, Status, NextAttemptUtc)
                                    EXEC mailq.StopMail @MailID = @MailID, @Reason = @StopReason;
                                END;
                            END;
                            -- Guarded: a re-registration meanwhile (@ResetCursorTo) undoes this call.
                            IF @Changed = 0
                            BEGIN
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
                            END;
                        END TRY
                        BEGIN CATCH
                            SELECT
                                @ErrorNumber = ERROR_NUMBER(),
                                @ErrorMessage = LEFT(ERROR_MESSAGE(), 4000),
                                @TranCountInCatch = @@TRANCOUNT;
                            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
                        END CATCH;
                    END;
                    -- A failed call: undone as a whole (doomed or not).
                    ELSE IF XACT_STATE() <> 0
                        ROLLBACK TRANSACTION;
                    IF @Changed = 1
                    BEGIN
                        SET @Suspend = CONCAT(
                            N' was altered while it was called; the call was rolled back. ',
                            N'Review it and run mailq.SetApplicationHook again.'
                        );
                        BREAK;
                    END;
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
                    -- 266, no transaction left: the hook ended ours; its work may be committed.
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
            END;
            -- The one write of 'Suspended', for the three reasons above; no transaction is open here.
            IF @Suspend IS NOT NULL
            BEGIN
                UPDATE h
                SET
                    h.LastError = CONCAT(N'Suspended: ', @Hook, @Suspend),
                    h.LastRunAtUtc = SYSUTCDATETIME()
                FROM mailq.ApplicationHook AS h
                WHERE h.AppName = @App AND h.ObjectId = @ObjectId AND h.DefinitionHash = @DefinitionHash  -- the pin
                    AND h.SchemaName = @SchemaName AND h.ProcedureName = @ProcedureName;  -- it checked, not a new one
                UPDATE @Summary SET State = N'Suspended' WHERE AppName = @App;
                SET @AppState = N'Suspended';
            END;
            IF @AppState = N'UpToDate'
            BEGIN
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
        -- Our own bookkeeping failed (hook errors are caught above).
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
