/*
mailq.ClaimMail: leases up to @BatchSize due mails to one worker; reads and locks grow with the
batch and the accounts that can send now, never with mail it cannot take (docs/claim.md).
Parameters:  @BatchSize INT 1-1000, default 10; @LockToken UNIQUEIDENTIFIER, required; @LeaseSeconds
             INT 1-3600, default 300; @AppName NULL: every application's mail, a name: only its own;
             @WorkerName; @AccountNames, @RunModes: JSON arrays served (NULL: all accounts, ["prod"]).
Result sets: 1. the mails leased: their columns, AttemptNo, LeaseExpiresUtc, PossibleDuplicate, DryRun,
                the template's name, version, model, LeaseSecondsRemaining (INT, whole seconds, floored)
             2. attachments (Content NULL: Generator makes it); 3. the template versions to render
Errors:      50130 @BatchSize, 50131 @LockToken, 50132 @LeaseSeconds, 50103 a name over 128,
             50115 @AppName not registered, 50148 @AccountNames, 50241 @RunModes
             (checked by mailq.CheckClaimRequest before the transaction).
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED
             (READPAST needs it); its queue reads lock, also under RCSI.
Lock order:  mailq.RateBudget (U), mailq.MailQueue (index keys U, rows X), mailq.MailAttempt, mailq.MailEvent.
Example:     EXEC mailq.ClaimMail @BatchSize = 100, @LockToken = @T, @WorkerName = N'host1/1';
*/
CREATE OR ALTER PROCEDURE mailq.ClaimMail
    @BatchSize INT = 10,
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT = 300,
    @AppName NVARCHAR(4000) = NULL,
    @WorkerName NVARCHAR(4000) = NULL,
    @AccountNames NVARCHAR(MAX) = NULL,
    @RunModes NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SET @BatchSize = COALESCE(@BatchSize, 10);
    SET @LeaseSeconds = COALESCE(@LeaseSeconds, 300);
    SET @RunModes = COALESCE(@RunModes, N'["prod"]');
    EXEC mailq.CheckClaimRequest
        @BatchSize = @BatchSize,
        @LockToken = @LockToken,
        @LeaseSeconds = @LeaseSeconds,
        @AppName = @AppName,
        @WorkerName = @WorkerName,
        @AccountNames = @AccountNames,
        @RunModes = @RunModes;
    DECLARE @Served TABLE (AccountName NVARCHAR(128) NOT NULL PRIMARY KEY);
    IF @AccountNames IS NOT NULL
        INSERT INTO @Served (AccountName)
        SELECT DISTINCT CAST(j.[value] AS NVARCHAR(128))
        FROM OPENJSON(@AccountNames) AS j
        WHERE LEN(j.[value]) <= 128;  -- a longer name is no account (never truncated into one)
    DECLARE @Modes TABLE (RunMode NVARCHAR(32) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY);
    INSERT INTO @Modes (RunMode)
    SELECT DISTINCT CAST(j.[value] AS NVARCHAR(32)) FROM OPENJSON(@RunModes) AS j;
    DECLARE @Now DATETIME2(3);
    DECLARE @LeaseUntil DATETIME2(3);
    DECLARE @MinuteStart DATETIME2(0);
    DECLARE @HourStart DATETIME2(0);
    DECLARE @DayStart DATETIME2(0);
    DECLARE @Acct TABLE (
        AccountName NVARCHAR(128) NOT NULL PRIMARY KEY,
        IsLimited BIT NOT NULL,
        BlockedUntilUtc DATETIME2(3) NULL,
        PerMinuteLimit INT NULL,
        PerHourLimit INT NULL,
        PerDayLimit INT NULL,
        MinuteStartUtc DATETIME2(0) NULL,
        MinuteCount INT NULL,
        HourStartUtc DATETIME2(0) NULL,
        HourCount INT NULL,
        DayStartUtc DATETIME2(0) NULL,
        DayCount INT NULL,
        Remaining INT NOT NULL DEFAULT (0),
        Taken INT NOT NULL DEFAULT (0)
    );
    DECLARE @Drive TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        RunMode NVARCHAR(32) NOT NULL,
        Taken INT NOT NULL DEFAULT (0),
        Cap INT NOT NULL DEFAULT (0),
        IsOpen BIT NOT NULL DEFAULT (1),
        PRIMARY KEY (AccountName, RunMode)
    );
    DECLARE @Draw TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        RunMode NVARCHAR(32) NOT NULL,
        PRIMARY KEY (AccountName, RunMode)
    );
    DECLARE @Pick TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Claimed TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AccountName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NULL,
        RunMode NVARCHAR(32) NOT NULL,
        OldStatus NVARCHAR(16) NOT NULL,
        OldLockToken UNIQUEIDENTIFIER NULL,
        AttemptNo INT NOT NULL,
        Pass INT NOT NULL,
        TemplateName NVARCHAR(128) NULL,
        TemplateVersion INT NULL
    );
    DECLARE @Pass INT = 0;
    DECLARE @Left INT = @BatchSize;
    DECLARE @Open INT;
    DECLARE @Share INT;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        INSERT INTO @Acct (AccountName, IsLimited, BlockedUntilUtc)
        SELECT a.AccountName, 0, a.BlockedUntilUtc
        FROM mailq.SendingAccount AS a
        WHERE
            a.PerMinuteLimit IS NULL AND a.PerHourLimit IS NULL AND a.PerDayLimit IS NULL
            AND (@AccountNames IS NULL OR a.AccountName IN (SELECT s.AccountName FROM @Served AS s));
        -- UPDLOCK: ours to commit; READPAST, ROWLOCK: skip held budgets; FORCESEEK: a scan locks them all.
        INSERT INTO @Acct (
            AccountName, IsLimited, BlockedUntilUtc, PerMinuteLimit, PerHourLimit, PerDayLimit,
            MinuteStartUtc, MinuteCount, HourStartUtc, HourCount, DayStartUtc, DayCount
        )
        SELECT
            a.AccountName, 1, a.BlockedUntilUtc, a.PerMinuteLimit, a.PerHourLimit, a.PerDayLimit,
            b.MinuteStartUtc, b.MinuteCount, b.HourStartUtc, b.HourCount, b.DayStartUtc, b.DayCount
        FROM mailq.SendingAccount AS a
        INNER JOIN mailq.RateBudget AS b WITH (FORCESEEK, UPDLOCK, READPAST, ROWLOCK)
            ON a.AccountName = b.AccountName
        WHERE
            (a.PerMinuteLimit IS NOT NULL OR a.PerHourLimit IS NOT NULL OR a.PerDayLimit IS NOT NULL)
            AND (@AccountNames IS NULL OR a.AccountName IN (SELECT s.AccountName FROM @Served AS s));
        SET @Now = SYSUTCDATETIME();
        SET @LeaseUntil = DATEADD(SECOND, @LeaseSeconds, @Now);
        SET @MinuteStart = DATEADD(MINUTE, DATEDIFF(MINUTE, '20000101', @Now), '20000101');
        SET @HourStart = DATEADD(HOUR, DATEDIFF(HOUR, '20000101', @Now), '20000101');
        SET @DayStart = CAST(CAST(@Now AS DATE) AS DATETIME2(0));
        DELETE FROM @Acct WHERE BlockedUntilUtc > @Now;
        UPDATE a
        SET a.Remaining = IIF(
            a.IsLimited = 0,
            @BatchSize,
            (
                SELECT MIN(w.Remaining)
                FROM (
                    VALUES
                    (COALESCE(a.PerMinuteLimit - IIF(a.MinuteStartUtc >= @MinuteStart, a.MinuteCount, 0), @BatchSize)),
                    (COALESCE(a.PerHourLimit - IIF(a.HourStartUtc >= @HourStart, a.HourCount, 0), @BatchSize)),
                    (COALESCE(a.PerDayLimit - IIF(a.DayStartUtc >= @DayStart, a.DayCount, 0), @BatchSize))
                ) AS w(Remaining)
            )
        )
        FROM @Acct AS a;
        DELETE FROM @Acct WHERE Remaining <= 0;
        UPDATE @Acct SET Remaining = @BatchSize WHERE Remaining > @BatchSize;
        INSERT INTO @Drive (AccountName, RunMode)
        SELECT a.AccountName, m.RunMode
        FROM @Acct AS a
        CROSS JOIN @Modes AS m;
        -- More pairs than slots: drop pairs without claimable mail (probes keep no lock), draw @BatchSize.
        IF (SELECT COUNT(*) FROM @Drive) > @BatchSize
        BEGIN
            IF @AppName IS NULL
                DELETE FROM d
                FROM @Drive AS d
                WHERE NOT EXISTS (
                    SELECT 1
                    FROM mailq.MailQueue AS k WITH (
                        INDEX (IX_MailQueue_ClaimByAccount), FORCESEEK, READPAST, READCOMMITTEDLOCK
                    )
                    WHERE
                        k.AccountName = d.AccountName
                        AND k.RunMode = d.RunMode
                        AND k.Status IN (N'UnSent', N'Sending')
                        AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                        AND k.VisibleAtUtc <= @Now
                        AND k.AttemptsRemaining > 0
                        AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                );
            ELSE
                DELETE FROM d
                FROM @Drive AS d
                WHERE NOT EXISTS (
                    SELECT 1
                    FROM mailq.MailQueue AS k WITH (
                        INDEX (IX_MailQueue_ClaimByApp), FORCESEEK, READPAST, READCOMMITTEDLOCK
                    )
                    WHERE
                        k.AccountName = d.AccountName
                        AND k.RunMode = d.RunMode
                        AND k.AppName = @AppName
                        AND k.AppName IS NOT NULL
                        AND k.Status IN (N'UnSent', N'Sending')
                        AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                        AND k.VisibleAtUtc <= @Now
                        AND k.AttemptsRemaining > 0
                        AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                );
            IF (SELECT COUNT(*) FROM @Drive) > @BatchSize
            BEGIN
                -- Materialized first: NEWID() in the DELETE's predicate may be evaluated again.
                INSERT INTO @Draw (AccountName, RunMode)
                SELECT TOP (@BatchSize) r.AccountName, r.RunMode FROM @Drive AS r ORDER BY NEWID();
                DELETE FROM d
                FROM @Drive AS d
                WHERE NOT EXISTS (
                    SELECT 1 FROM @Draw AS w
                    WHERE w.AccountName = d.AccountName AND w.RunMode = d.RunMode
                );
            END;
        END;
        WHILE @Pass < 3 AND @Left > 0
        BEGIN
            SET @Pass += 1;
            SELECT @Open = COUNT(*)
            FROM @Drive AS d
            INNER JOIN @Acct AS a ON d.AccountName = a.AccountName
            WHERE d.IsOpen = 1 AND a.Remaining > a.Taken;
            IF @Open = 0 BREAK;
            SET @Share = IIF(@Left / @Open < 1, 1, @Left / @Open);
            UPDATE @Drive SET Cap = 0;
            UPDATE d
            SET d.Cap = IIF(x.Part < @Share, x.Part, @Share)
            FROM @Drive AS d
            INNER JOIN (
                SELECT
                    o.AccountName,
                    o.RunMode,
                    o.Rest / o.Pairs + IIF(o.Seq <= o.Rest % o.Pairs, 1, 0) AS Part
                FROM (
                    SELECT
                        d2.AccountName,
                        d2.RunMode,
                        a.Remaining - a.Taken AS Rest,
                        COUNT(*) OVER (PARTITION BY d2.AccountName) AS Pairs,
                        ROW_NUMBER() OVER (PARTITION BY d2.AccountName ORDER BY NEWID()) AS Seq
                    FROM @Drive AS d2
                    INNER JOIN @Acct AS a ON d2.AccountName = a.AccountName
                    WHERE d2.IsOpen = 1 AND a.Remaining > a.Taken
                ) AS o
            ) AS x ON d.AccountName = x.AccountName AND d.RunMode = x.RunMode;
            -- The pick: INDEX + FORCESEEK, never a scan; READPAST, UPDLOCK, ROWLOCK: skip held rows, keep ours.
            DELETE FROM @Pick;
            IF @AppName IS NULL
                INSERT INTO @Pick (ID)
                SELECT TOP (@Left) c.ID
                FROM (SELECT r.AccountName, r.RunMode, r.Cap FROM @Drive AS r WHERE r.Cap > 0) AS d
                CROSS APPLY (
                    SELECT TOP (d.Cap)
                        k.ID,
                        k.Priority,
                        k.VisibleAtUtc,
                        ROW_NUMBER() OVER (ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC) AS Turn
                    FROM mailq.MailQueue AS k WITH (
                        INDEX (IX_MailQueue_ClaimByAccount), FORCESEEK, READPAST, UPDLOCK, ROWLOCK
                    )
                    WHERE
                        k.AccountName = d.AccountName
                        AND k.RunMode = d.RunMode
                        AND k.Status IN (N'UnSent', N'Sending')
                        AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                        AND k.VisibleAtUtc <= @Now
                        AND k.AttemptsRemaining > 0
                        AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                    ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC
                ) AS c
                ORDER BY c.Turn ASC, c.Priority DESC, c.VisibleAtUtc ASC, c.ID ASC;
            ELSE
                INSERT INTO @Pick (ID)
                SELECT TOP (@Left) c.ID
                FROM (SELECT r.AccountName, r.RunMode, r.Cap FROM @Drive AS r WHERE r.Cap > 0) AS d
                CROSS APPLY (
                    SELECT TOP (d.Cap)
                        k.ID,
                        k.Priority,
                        k.VisibleAtUtc,
                        ROW_NUMBER() OVER (ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC) AS Turn
                    FROM mailq.MailQueue AS k WITH (
                        INDEX (IX_MailQueue_ClaimByApp), FORCESEEK, READPAST, UPDLOCK, ROWLOCK
                    )
                    WHERE
                        k.AccountName = d.AccountName
                        AND k.RunMode = d.RunMode
                        AND k.AppName = @AppName
                        AND k.AppName IS NOT NULL
                        AND k.Status IN (N'UnSent', N'Sending')
                        AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                        AND k.VisibleAtUtc <= @Now
                        AND k.AttemptsRemaining > 0
                        AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                    ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC
                ) AS c
                ORDER BY c.Turn ASC, c.Priority DESC, c.VisibleAtUtc ASC, c.ID ASC;
            -- The lease, re-checked; READPAST: our key U and another's clustered X cannot deadlock.
            UPDATE q
            SET
                q.Status = N'Sending',
                q.ThreadLock = @LockToken,
                q.VisibleAtUtc = @LeaseUntil,
                q.AttemptsRemaining = q.AttemptsRemaining - 1,
                q.AttemptCount = q.AttemptCount + 1,
                -- An expired lease may hide a mail already handed to SMTP.
                q.PossibleDuplicate = IIF(q.Status = N'Sending', CAST(1 AS BIT), q.PossibleDuplicate),
                q.DryRun = COALESCE(
                    (SELECT ap.DryRun FROM mailq.Application AS ap WHERE ap.AppName = q.AppName),
                    CAST(0 AS BIT)
                )
            OUTPUT
                inserted.ID,
                inserted.AccountName,
                inserted.AppName,
                inserted.RunMode,
                deleted.Status,
                deleted.ThreadLock,
                inserted.AttemptCount,
                @Pass,
                inserted.TemplateName,
                inserted.TemplateVersion
            INTO @Claimed (
                ID, AccountName, AppName, RunMode, OldStatus, OldLockToken, AttemptNo, Pass,
                TemplateName, TemplateVersion
            )
            FROM mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)), READPAST, UPDLOCK, ROWLOCK)
            WHERE
                q.ID IN (SELECT p.ID FROM @Pick AS p)
                AND q.Status IN (N'UnSent', N'Sending')
                AND q.VisibleAtUtc <= @Now
                AND q.AttemptsRemaining > 0;
            UPDATE d
            SET
                d.Taken = d.Taken + COALESCE(n.Claimed, 0),
                d.IsOpen = IIF(COALESCE(n.Claimed, 0) < d.Cap, 0, d.IsOpen)
            FROM @Drive AS d
            LEFT JOIN (
                SELECT m.AccountName, m.RunMode, COUNT(*) AS Claimed
                FROM @Claimed AS m
                WHERE m.Pass = @Pass
                GROUP BY m.AccountName, m.RunMode
            ) AS n ON d.AccountName = n.AccountName AND d.RunMode = n.RunMode
            WHERE d.Cap > 0;
            UPDATE a
            SET a.Taken = n.Claimed
            FROM @Acct AS a
            INNER JOIN (
                SELECT m.AccountName, COUNT(*) AS Claimed
                FROM @Claimed AS m
                GROUP BY m.AccountName
            ) AS n ON a.AccountName = n.AccountName;
            SET @Left = @BatchSize - (SELECT COUNT(*) FROM @Claimed);
        END;
        UPDATE b
        SET
            b.MinuteCount = IIF(b.MinuteStartUtc >= @MinuteStart, b.MinuteCount, 0) + a.Taken,
            b.MinuteStartUtc = IIF(b.MinuteStartUtc >= @MinuteStart, b.MinuteStartUtc, @MinuteStart),
            b.HourCount = IIF(b.HourStartUtc >= @HourStart, b.HourCount, 0) + a.Taken,
            b.HourStartUtc = IIF(b.HourStartUtc >= @HourStart, b.HourStartUtc, @HourStart),
            b.DayCount = IIF(b.DayStartUtc >= @DayStart, b.DayCount, 0) + a.Taken,
            b.DayStartUtc = IIF(b.DayStartUtc >= @DayStart, b.DayStartUtc, @DayStart)
        FROM mailq.RateBudget AS b WITH (FORCESEEK, ROWLOCK)  -- only the budget rows U-locked above
        INNER JOIN @Acct AS a ON b.AccountName = a.AccountName
        WHERE a.IsLimited = 1 AND a.Taken > 0;
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Abandoned',
            t.ErrorText = N'Lease expired before the worker acknowledged; reclaimed.'
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek by mail ID, never a scan
        INNER JOIN @Claimed AS c
            ON t.MailID = c.ID AND t.LockToken = c.OldLockToken
        WHERE c.OldStatus = N'Sending' AND t.EndedAtUtc IS NULL;
        UPDATE c
        SET c.TemplateVersion = COALESCE(c.TemplateVersion, IIF(t.RetiredAtUtc IS NULL, t.LatestVersion, NULL))
        FROM @Claimed AS c
        INNER JOIN mailq.MailTemplate AS t WITH (FORCESEEK) ON c.TemplateName = t.TemplateName
        WHERE c.TemplateName IS NOT NULL;
        INSERT INTO mailq.MailAttempt (MailID, AttemptNo, LockToken, WorkerName, StartedAtUtc, TemplateVersion)
        SELECT c.ID, c.AttemptNo, @LockToken, @WorkerName, @Now, c.TemplateVersion
        FROM @Claimed AS c;
        -- Events (docs/events.md): two statements, so LeaseExpired is stamped before Claimed.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT
            c.ID, c.AppName, N'LeaseExpired', N'Sending', c.AttemptNo - 1, NULL,
            N'Lease expired before the worker acknowledged; reclaimed (PossibleDuplicate).', @Now
        FROM @Claimed AS c
        WHERE c.OldStatus = N'Sending';
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT c.ID, c.AppName, N'Claimed', N'Sending', c.AttemptNo, NULL, @WorkerName, @Now
        FROM @Claimed AS c;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    DECLARE @ReturnedAt DATETIME2(3) = SYSUTCDATETIME();
    SELECT
        q.ID,
        q.MessageID,
        q.AccountName,
        q.AppName,
        q.FromName,
        q.FromAddress,
        q.ReplyTo,
        q.ToAddress,
        q.CC,
        q.BCC,
        q.Subject,
        q.Body,
        q.BodyFormat,
        q.TextBody,
        q.Headers,
        q.Priority,
        q.AttemptCount AS AttemptNo,
        q.AttemptsRemaining,
        q.VisibleAtUtc AS LeaseExpiresUtc,
        q.PossibleDuplicate,
        q.dtStamp,
        q.RunMode,
        q.DryRun,
        c.TemplateName,
        c.TemplateVersion,
        q.TemplateModel,
        CAST(FLOOR(DATEDIFF_BIG(MILLISECOND, @ReturnedAt, q.VisibleAtUtc) / 1000.0) AS INT) AS LeaseSecondsRemaining
    FROM mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)))
    INNER JOIN @Claimed AS c ON q.ID = c.ID
    WHERE q.ThreadLock = @LockToken
    ORDER BY q.Priority DESC, q.ID ASC;
    SELECT
        a.MailID,
        a.AttachmentNo,
        a.FileName,
        a.ContentType,
        a.Content,
        a.Generator,
        a.GeneratorArgs
    FROM mailq.MailAttachment AS a WITH (FORCESEEK (PK_MailAttachment (MailID)))
    INNER JOIN @Claimed AS c ON a.MailID = c.ID
    ORDER BY a.MailID ASC, a.AttachmentNo ASC;
    WITH Used AS (
        SELECT DISTINCT c.TemplateName, c.TemplateVersion
        FROM @Claimed AS c
        WHERE c.TemplateVersion IS NOT NULL
    )

    SELECT
        v.TemplateName,
        v.Version,
        v.SubjectTemplate,
        v.HtmlTemplate,
        v.TextTemplate
    FROM Used AS u
    INNER JOIN mailq.MailTemplateVersion AS v WITH (FORCESEEK)  -- one seek per distinct version
        ON u.TemplateName = v.TemplateName AND u.TemplateVersion = v.Version
    ORDER BY v.TemplateName ASC, v.Version ASC;
END;
