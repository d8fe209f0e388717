/*
delay.RunDueTasks: a reader's work between two messages: the hook run when due
(mailq.HookDispatcher: one reader wins it, READPAST; mailq.RunApplicationHooks runs
outside any transaction, its error kept in LastError), then claim and run until
nothing is due.  A claim is one short transaction on
IX_Task_Due (READPAST, UPDLOCK, ROWLOCK) of up to BatchSize rows: first the sweep,
Claimed tasks whose lease passed (a running task's row and session lock are held by
its run, so the sweep passes it by: a task never runs twice at once), then Pending tasks due now,
oldest first; each claim gets a new token and LeaseSeconds.  Each task then runs in
its own transaction (delay.RunTask), and the batch's receipts follow
(delay.WriteReceipts).  A full batch sends one MailqDelayRequest on the dispatcher
conversation: activation then starts another reader.  A copy of the database (its
service_broker_guid is not delay.Dispatcher's) runs nothing until delay.EnableThisDatabase.
Parameters:  @Claimed INT OUTPUT: tasks claimed by this call
Transaction: none open on entry; one per claim, per task, per receipt batch.
Example:     EXEC delay.RunDueTasks @Claimed = @Claimed OUTPUT;   -- dbo.ProcessDelayQueue
*/
CREATE OR ALTER PROCEDURE delay.RunDueTasks
    @Claimed INT = 0 OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;   -- READPAST is refused under SERIALIZABLE and SNAPSHOT
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME(), @Token UNIQUEIDENTIFIER, @TaskID BIGINT, @Count INT, @Batch INT = 50,
        @LeaseSeconds INT = 30, @Handle UNIQUEIDENTIFIER, @Error NVARCHAR(4000);
    DECLARE @Claim TABLE (TaskID BIGINT NOT NULL PRIMARY KEY);
    SET @Claimed = -1;   -- -1: a copy not enabled here (below); its reader leaves, polling nothing
    -- The identity is recorded by the first pass after deployment (then only by delay.EnableThisDatabase).
    UPDATE d SET d.BrokerGuid = db.service_broker_guid
    FROM delay.Dispatcher AS d INNER JOIN sys.databases AS db ON db.database_id = DB_ID()
    WHERE d.DispatcherId = 1 AND d.BrokerGuid IS NULL;
    IF NOT EXISTS (
        SELECT 1 FROM delay.Dispatcher AS d
        INNER JOIN sys.databases AS db ON d.BrokerGuid = db.service_broker_guid AND db.database_id = DB_ID()
        WHERE d.DispatcherId = 1
    )
        RETURN;
    SET @Claimed = 0;
    UPDATE h
    SET h.NextRunAtUtc = DATEADD(SECOND, h.IntervalSeconds, @Now), h.LastRunAtUtc = @Now
    FROM mailq.HookDispatcher AS h WITH (READPAST, ROWLOCK)
    WHERE h.Singleton = 1 AND h.Enabled = 1 AND h.NextRunAtUtc <= @Now;
    IF @@ROWCOUNT = 1
    BEGIN
        BEGIN TRY
            EXEC mailq.RunApplicationHooks @MaxEvents = 1000, @Quiet = 1;
        END TRY
        BEGIN CATCH
            SET @Error = LEFT(CONCAT(N'error ', ERROR_NUMBER(), N': ', ERROR_MESSAGE()), 4000);
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        END CATCH;
        UPDATE h SET h.LastError = @Error FROM mailq.HookDispatcher AS h WHERE h.Singleton = 1;
    END;
    WHILE 1 = 1
    BEGIN
        EXEC delay.WriteReceipts;   -- first: the last batch's, and those others made due (disallowed, orphaned)
        SELECT @Batch = s.BatchSize, @LeaseSeconds = s.LeaseSeconds FROM delay.Setting AS s WHERE s.SettingId = 1;
        SELECT @Now = SYSUTCDATETIME(), @Token = NEWID();
        DELETE FROM @Claim;
        BEGIN TRANSACTION;
        -- READPAST: skip rows others hold; UPDLOCK: claim while reading; ROWLOCK: skip rows, not pages.
        UPDATE TOP (@Batch) t
        SET t.ClaimToken = @Token, t.LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now), t.Claims = t.Claims + 1
        OUTPUT inserted.TaskID INTO @Claim (TaskID)
        FROM delay.Task AS t WITH (READPAST, UPDLOCK, ROWLOCK, INDEX (IX_Task_Due))
        WHERE t.TaskState = N'Claimed' AND t.LeaseUntilUtc < @Now
            AND APPLOCK_TEST(N'public', CONCAT(N'mailq-db/delay/run/', t.TaskID), N'Exclusive', N'Session') = 1;
        SET @Count = @@ROWCOUNT;
        WITH Due AS (
            SELECT TOP (@Batch - @Count) t.TaskID, t.TaskState, t.ClaimToken, t.LeaseUntilUtc, t.Claims
            FROM delay.Task AS t WITH (READPAST, UPDLOCK, ROWLOCK, INDEX (IX_Task_Due))
            WHERE t.TaskState = N'Pending' AND t.NextRunAtUtc <= @Now
            ORDER BY t.NextRunAtUtc
        )

        UPDATE Due
        SET TaskState = N'Claimed', ClaimToken = @Token, LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now),
            Claims = Claims + 1
        OUTPUT inserted.TaskID INTO @Claim (TaskID);
        COMMIT TRANSACTION;
        SET @Count = (SELECT COUNT(*) FROM @Claim);
        IF @Count = 0 RETURN;
        SET @Claimed += @Count;
        IF @Count = @Batch
        BEGIN
            SET LOCK_TIMEOUT 200;   -- an inserter's arm holds the conversation group to its commit
            BEGIN TRY
                SELECT @Handle = d.ConversationHandle FROM delay.Dispatcher AS d WHERE d.DispatcherId = 1;
                SEND ON CONVERSATION @Handle MESSAGE TYPE MailqDelayRequest;
            END TRY
            BEGIN CATCH
                -- Busy (1222) or lost (delay.ArmDispatcher begins a new one): no request this time.
                IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            END CATCH;
            SET LOCK_TIMEOUT -1;
        END;
        SET @TaskID = 0;
        WHILE 1 = 1
        BEGIN
            SELECT @TaskID = MIN(c.TaskID) FROM @Claim AS c WHERE c.TaskID > @TaskID;
            IF @TaskID IS NULL BREAK;
            EXEC delay.RunTask @TaskID = @TaskID, @ClaimToken = @Token;
        END;
    END;
END;
