/*
mailq.ClaimMail: leases up to @BatchSize due mails to one worker.
A mail is claimable when it is UnSent and due, or Sending with an expired
lease (its worker died or stalled): VisibleAtUtc <= now in both cases.
Order: highest Priority first, then oldest VisibleAtUtc, then ID.
The claim is ONE UPDATE statement (READPAST, UPDLOCK, ROWLOCK), so two
workers never take the same mail and a claimer never waits on another.  In
the same statement, a reclaimed mail with no attempt left becomes Failed and
a mail past its ExpiresAtUtc becomes Expired (neither is returned).
Rate limits: accounts with limits are charged in mailq.RateBudget inside this
transaction, so the limits hold across every worker.  The budget row is read
WITH (UPDLOCK, READPAST): while another claimer holds an account's budget,
this claimer skips that account's mail instead of waiting.  Accounts whose
BlockedUntilUtc is in the future are skipped; their mail is neither claimed
nor expired until the account may send again.  Such mail, when it ranks
first, is read past by the seek: a long-blocked high-priority backlog makes
claims of other accounts' mail cost more (see docs/dba-guide.md).
Parameters:  @BatchSize    INT 1-1000, default 10
             @LockToken    UNIQUEIDENTIFIER, required: the worker's token for
                           this batch; every acknowledgement must present it
             @LeaseSeconds INT 1-3600, default 300
             @AppName      NULL (default): claim every application's mail
                           (competing); a name: only that application's mail (isolated)
             @WorkerName   NVARCHAR(128), recorded in mailq.MailAttempt
             @AccountNames NULL (default): every account; else a JSON array of
                           the account names this worker can send for (a worker
                           without credentials for an account never claims its mail)
Result sets: 1. one row per claimed mail: ID, MessageID, AccountName, AppName,
                FromName, FromAddress, ReplyTo, ToAddress, CC, BCC, Subject,
                Body, BodyFormat, TextBody, Headers, Priority, AttemptNo,
                AttemptsRemaining, LeaseExpiresUtc, PossibleDuplicate, dtStamp
             2. their attachments: MailID, AttachmentNo, FileName, ContentType, Content
Errors:      50130 @BatchSize out of range; 50131 @LockToken missing;
             50132 @LeaseSeconds out of range; 50103 a name over its size;
             50115 unknown @AppName; 50148 @AccountNames not a JSON array of names.
Transaction: joins the caller's via a savepoint, else opens its own; the
             result sets are read after the commit (the rows are leased).
Example:     EXEC mailq.ClaimMail @BatchSize = 100, @LockToken = 'A1F0...',
                 @LeaseSeconds = 300, @WorkerName = N'host1/1';
*/
CREATE OR ALTER PROCEDURE mailq.ClaimMail
    @BatchSize INT = 10,
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT = 300,
    @AppName NVARCHAR(4000) = NULL,
    @WorkerName NVARCHAR(4000) = NULL,
    @AccountNames NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    SET @BatchSize = COALESCE(@BatchSize, 10);
    SET @LeaseSeconds = COALESCE(@LeaseSeconds, 300);

    -- 1. Validate parameters before any transaction starts.
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50130, @Msg, 1;
    END;
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: a new GUID per claimed batch.', 1;
    IF @LeaseSeconds NOT BETWEEN 1 AND 3600
    BEGIN
        SET @Msg = CONCAT(N'@LeaseSeconds must be 1-3600; got ', @LeaseSeconds, N'.');
        THROW 50132, @Msg, 1;
    END;
    IF LEN(@AppName) > 128 OR LEN(@WorkerName) > 128
        THROW 50103, N'@AppName and @WorkerName are limited to 128 characters.', 1;
    IF @AppName IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(N'@AppName ''', @AppName, N''' is not a registered application.');
        THROW 50115, @Msg, 1;
    END;

    IF
        @AccountNames IS NOT NULL
        AND (
            ISJSON(@AccountNames) = 0
            OR LEFT(LTRIM(@AccountNames), 1) <> N'['
            OR EXISTS (SELECT 1 FROM OPENJSON(@AccountNames) AS j WHERE j.[type] <> 1)
        )
        THROW 50148, N'@AccountNames must be a JSON array of account names, e.g. ["default", "overseas"].', 1;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @LeaseUntil DATETIME2(3) = DATEADD(SECOND, @LeaseSeconds, @Now);
    DECLARE @MinuteStart DATETIME2(0) = DATEADD(MINUTE, DATEDIFF(MINUTE, '20000101', @Now), '20000101');
    DECLARE @HourStart DATETIME2(0) = DATEADD(HOUR, DATEDIFF(HOUR, '20000101', @Now), '20000101');
    DECLARE @DayStart DATETIME2(0) = CAST(CAST(@Now AS DATE) AS DATETIME2(0));

    DECLARE @Budget TABLE (
        AccountName NVARCHAR(128) NOT NULL PRIMARY KEY,
        Remaining INT NOT NULL,
        IsLimited BIT NOT NULL
    );
    DECLARE @Claimed TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AccountName NVARCHAR(128) NOT NULL,
        NewStatus NVARCHAR(16) NOT NULL,
        OldStatus NVARCHAR(16) NOT NULL,
        OldLockToken UNIQUEIDENTIFIER NULL,
        AttemptNo INT NOT NULL
    );

    -- 2. Own the transaction, or nest in the caller's with a savepoint.
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION ClaimMail;

        -- Accounts without limits: no budget to take, so no lock either.
        INSERT INTO @Budget (AccountName, Remaining, IsLimited)
        SELECT a.AccountName, @BatchSize, 0
        FROM mailq.SendingAccount AS a
        WHERE
            a.PerMinuteLimit IS NULL AND a.PerHourLimit IS NULL AND a.PerDayLimit IS NULL
            AND (a.BlockedUntilUtc IS NULL OR a.BlockedUntilUtc <= @Now)
            AND (@AccountNames IS NULL OR a.AccountName IN (SELECT j.[value] FROM OPENJSON(@AccountNames) AS j));

        -- Accounts with limits: what is left of each window.
        -- UPDLOCK:  the budget row stays ours until commit, so two claimers
        --           cannot both spend the same remainder;
        -- READPAST: a budget row held by another claimer is skipped (that
        --           account's mail waits for the next claim), never waited on;
        -- ROWLOCK:  row grain, so READPAST skips one account, not a page.
        INSERT INTO @Budget (AccountName, Remaining, IsLimited)
        SELECT
            a.AccountName,
            (
                SELECT MIN(w.Remaining)
                FROM (
                    VALUES
                    (COALESCE(a.PerMinuteLimit - IIF(b.MinuteStartUtc = @MinuteStart, b.MinuteCount, 0), @BatchSize)),
                    (COALESCE(a.PerHourLimit - IIF(b.HourStartUtc = @HourStart, b.HourCount, 0), @BatchSize)),
                    (COALESCE(a.PerDayLimit - IIF(b.DayStartUtc = @DayStart, b.DayCount, 0), @BatchSize))
                ) AS w(Remaining)
            ) AS Remaining,
            1
        FROM mailq.SendingAccount AS a
        INNER JOIN mailq.RateBudget AS b WITH (UPDLOCK, READPAST, ROWLOCK)
            ON a.AccountName = b.AccountName
        WHERE
            (a.PerMinuteLimit IS NOT NULL OR a.PerHourLimit IS NOT NULL OR a.PerDayLimit IS NOT NULL)
            AND (a.BlockedUntilUtc IS NULL OR a.BlockedUntilUtc <= @Now)
            AND (@AccountNames IS NULL OR a.AccountName IN (SELECT j.[value] FROM OPENJSON(@AccountNames) AS j));

        DELETE FROM @Budget WHERE Remaining <= 0;

        -- The claim: one statement.  The Candidate CTE is the seek on
        -- IX_MailQueue_Claim described beside that index (ten ranges, already
        -- in ORDER BY order, TOP stops early).
        --   READPAST: skip rows other workers hold instead of waiting on them;
        --   UPDLOCK:  claim while reading, so two workers can't take one row;
        --   ROWLOCK:  row grain, so READPAST skips rows rather than pages.
        -- Ranked numbers each account's sendable rows so that an account with
        -- a smaller remaining budget than its share of the batch is charged
        -- only up to its budget; the other candidates stay UnSent (their
        -- update locks end with this short transaction).
        WITH Candidate AS (
            SELECT TOP (@BatchSize)
                q.ID,
                q.AccountName,
                q.Priority,
                q.VisibleAtUtc,
                q.Status,
                q.ThreadLock,
                q.AttemptsRemaining,
                q.AttemptCount,
                q.PossibleDuplicate,
                q.DateProcessed,
                q.LastError,
                IIF(q.AttemptsRemaining > 0 AND (q.ExpiresAtUtc IS NULL OR q.ExpiresAtUtc > @Now), 1, 0) AS WillSend
            FROM mailq.MailQueue AS q WITH (READPAST, UPDLOCK, ROWLOCK)
            WHERE
                q.Status IN (N'UnSent', N'Sending')
                AND q.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                AND q.VisibleAtUtc <= @Now
                AND (@AppName IS NULL OR q.AppName = @AppName)
                AND EXISTS (SELECT 1 FROM @Budget AS b WHERE b.AccountName = q.AccountName)
            ORDER BY q.Priority DESC, q.VisibleAtUtc ASC, q.ID ASC
        ),

        Ranked AS (
            SELECT
                c.ID,
                c.AccountName,
                c.VisibleAtUtc,
                c.Status,
                c.ThreadLock,
                c.AttemptsRemaining,
                c.AttemptCount,
                c.PossibleDuplicate,
                c.DateProcessed,
                c.LastError,
                c.WillSend,
                ROW_NUMBER() OVER (
                    PARTITION BY c.AccountName, c.WillSend
                    ORDER BY c.Priority DESC, c.VisibleAtUtc ASC, c.ID ASC
                ) AS AccountRank
            FROM Candidate AS c
        )

        UPDATE r
        SET
            r.Status = CASE
                WHEN r.WillSend = 1 THEN N'Sending'
                WHEN r.AttemptsRemaining <= 0 THEN N'Failed'
                ELSE N'Expired'
            END,
            r.ThreadLock = IIF(r.WillSend = 1, @LockToken, NULL),
            r.VisibleAtUtc = IIF(r.WillSend = 1, @LeaseUntil, r.VisibleAtUtc),
            r.AttemptsRemaining = r.AttemptsRemaining - r.WillSend,
            r.AttemptCount = r.AttemptCount + r.WillSend,
            -- A lease that expired may hide a mail the dead worker already
            -- handed to SMTP: flag it (receivers can drop it by Message-ID).
            r.PossibleDuplicate = IIF(r.Status = N'Sending', CAST(1 AS BIT), r.PossibleDuplicate),
            r.DateProcessed = IIF(r.WillSend = 1, r.DateProcessed, @Now),
            r.LastError = CASE
                WHEN r.WillSend = 1 THEN r.LastError
                WHEN r.AttemptsRemaining <= 0
                    THEN CONCAT(N'No attempt left after an abandoned lease. Last error: ', r.LastError)
                ELSE N'Expired before it could be sent (ExpiresAtUtc passed).'
            END
        OUTPUT
            inserted.ID,
            inserted.AccountName,
            inserted.Status,
            deleted.Status,
            deleted.ThreadLock,
            inserted.AttemptCount
        INTO @Claimed (ID, AccountName, NewStatus, OldStatus, OldLockToken, AttemptNo)
        FROM Ranked AS r
        WHERE
            r.WillSend = 0
            OR r.AccountRank <= (SELECT b.Remaining FROM @Budget AS b WHERE b.AccountName = r.AccountName);

        -- Charge the budget of limited accounts (rows already U-locked above).
        -- FORCESEEK, ROWLOCK: touch only those rows; a scan would wait on the
        -- budget rows other claimers hold.
        UPDATE b
        SET
            b.MinuteCount = IIF(b.MinuteStartUtc = @MinuteStart, b.MinuteCount, 0) + c.ClaimedCount,
            b.MinuteStartUtc = @MinuteStart,
            b.HourCount = IIF(b.HourStartUtc = @HourStart, b.HourCount, 0) + c.ClaimedCount,
            b.HourStartUtc = @HourStart,
            b.DayCount = IIF(b.DayStartUtc = @DayStart, b.DayCount, 0) + c.ClaimedCount,
            b.DayStartUtc = @DayStart
        FROM mailq.RateBudget AS b WITH (FORCESEEK, ROWLOCK)
        INNER JOIN (
            SELECT m.AccountName, COUNT(*) AS ClaimedCount
            FROM @Claimed AS m
            WHERE m.NewStatus = N'Sending'
            GROUP BY m.AccountName
        ) AS c ON b.AccountName = c.AccountName
        WHERE b.AccountName IN (SELECT l.AccountName FROM @Budget AS l WHERE l.IsLimited = 1);

        -- Close the attempts of reclaimed leases as abandoned (FORCESEEK,
        -- ROWLOCK: seek by mail ID; never scan attempts other sessions hold).
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Abandoned',
            t.ErrorText = N'Lease expired before the worker acknowledged; reclaimed.'
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)
        INNER JOIN @Claimed AS c
            ON t.MailID = c.ID AND t.LockToken = c.OldLockToken
        WHERE c.OldStatus = N'Sending' AND t.EndedAtUtc IS NULL;

        -- Open an attempt for each mail now leased.
        INSERT INTO mailq.MailAttempt (MailID, AttemptNo, LockToken, WorkerName, StartedAtUtc)
        SELECT c.ID, c.AttemptNo, @LockToken, @WorkerName, @Now
        FROM @Claimed AS c
        WHERE c.NewStatus = N'Sending';

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION ClaimMail;
        THROW;
    END CATCH;

    -- 3. Return the leased mails (ours until LeaseExpiresUtc; no lock needed).
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
        q.dtStamp
    FROM mailq.MailQueue AS q
    INNER JOIN @Claimed AS c ON q.ID = c.ID
    WHERE c.NewStatus = N'Sending' AND q.ThreadLock = @LockToken
    ORDER BY q.Priority DESC, q.ID ASC;

    SELECT
        a.MailID,
        a.AttachmentNo,
        a.FileName,
        a.ContentType,
        a.Content
    FROM mailq.MailAttachment AS a
    INNER JOIN @Claimed AS c ON a.MailID = c.ID
    WHERE c.NewStatus = N'Sending'
    ORDER BY a.MailID ASC, a.AttachmentNo ASC;
END;
