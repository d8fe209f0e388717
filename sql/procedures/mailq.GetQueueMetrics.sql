/*
mailq.GetQueueMetrics: the queue's own metrics in one cheap call, for
`mailq-db exporter` and `mailq-db dashboard` (docs/monitoring/README.md).
Parameters:  @WindowMinutes INT 1-60 = 5: complete UTC minutes before now (set 5)
Result sets: 1. MeasuredAtUtc, WindowStartUtc, WindowEndUtc, CallerIsMailqAdmin
             2. depth: AccountName, RunMode, Status (UnSent, Sending), MailCount
             3. per (account, run mode): DueCount (the claim's test), IsBlocked,
                SendableCount (0 when blocked), OldestSendableUtc,
                OldestSendableAgeSeconds (0 when nothing is sendable)
             4. accounts: AccountName, IsBlocked, BlockedUntilUtc, BlockedSecondsLeft,
                BlockReason, PerMinuteLimit, PerHourLimit, PerDayLimit
             5. attempts ended in the window: MinuteUtc, AccountName, Outcome,
                ReplyClass ('2xx', '4xx', '5xx', 'none'), Attempts
             6. suppressions in force: AccountName, Reason, Suppressed
Cost:        queued mail + mail in flight + attempts in the window + suppressed
             addresses (forced seeks and small scans); never the sent history.
Errors:      50580 @WindowMinutes out of range.
Transaction: reads only; opens none.
Isolation:   READ COMMITTED, set here (no lock kept past a statement).
Lock order:  none (no locking reads).
Example:     EXEC mailq.GetQueueMetrics @WindowMinutes = 5;
*/
CREATE OR ALTER PROCEDURE mailq.GetQueueMetrics
    @WindowMinutes INT = 5
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @WindowMinutes = COALESCE(@WindowMinutes, 5);
    IF @WindowMinutes NOT BETWEEN 1 AND 60
    BEGIN
        SET @Msg = CONCAT(N'@WindowMinutes must be 1-60; got ', @WindowMinutes, N'.');
        THROW 50580, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @WindowEnd DATETIME2(3) = DATEADD(
        MINUTE, DATEDIFF(MINUTE, '20000101', @Now), CAST('20000101' AS DATETIME2(3))
    );
    DECLARE @WindowStart DATETIME2(3) = DATEADD(MINUTE, -@WindowMinutes, @WindowEnd);
    DECLARE @Pair TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        RunMode NVARCHAR(32) NOT NULL,
        MailCount BIGINT NOT NULL,
        DueCount BIGINT NOT NULL,
        OldestDueUtc DATETIME2(3) NULL,
        SendingCount BIGINT NOT NULL DEFAULT (0),
        PRIMARY KEY (AccountName, RunMode)
    );
    -- The claim's index, filtered to UnSent and Sending: the literal Status list
    -- matches the filter, INDEX keeps it whatever the statistics say.
    INSERT INTO @Pair (AccountName, RunMode, MailCount, DueCount, OldestDueUtc)
    SELECT
        k.AccountName,
        k.RunMode,
        COUNT_BIG(*),
        SUM(IIF(k.VisibleAtUtc <= @Now AND k.AttemptsRemaining > 0
            AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now), CAST(1 AS BIGINT), CAST(0 AS BIGINT))),
        MIN(IIF(k.VisibleAtUtc <= @Now AND k.AttemptsRemaining > 0
            AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now), k.VisibleAtUtc, NULL))
    FROM mailq.MailQueue AS k WITH (INDEX (IX_MailQueue_ClaimByAccount))
    WHERE k.Status IN (N'UnSent', N'Sending')
    GROUP BY k.AccountName, k.RunMode;
    -- In flight: a seek on IX_MailQueue_Status's Sending range, one lookup per mail.
    UPDATE p
    SET p.SendingCount = s.SendingCount
    FROM @Pair AS p
    INNER JOIN (
        SELECT q.AccountName, q.RunMode, COUNT_BIG(*) AS SendingCount
        FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Status), FORCESEEK)
        WHERE q.Status = N'Sending'
        GROUP BY q.AccountName, q.RunMode
    ) AS s ON p.AccountName = s.AccountName AND p.RunMode = s.RunMode;
    SELECT
        @Now AS MeasuredAtUtc,
        @WindowStart AS WindowStartUtc,
        @WindowEnd AS WindowEndUtc,
        CAST(IIF(IS_ROLEMEMBER(N'MailqAdmin') = 1 OR IS_ROLEMEMBER(N'db_owner') = 1, 1, 0) AS BIT)
        AS CallerIsMailqAdmin;
    SELECT
        d.AccountName,
        d.RunMode,
        d.Status,
        d.MailCount
    FROM (
        SELECT p.AccountName, p.RunMode, N'UnSent' AS Status, p.MailCount - p.SendingCount AS MailCount
        FROM @Pair AS p
        UNION ALL
        SELECT p.AccountName, p.RunMode, N'Sending' AS Status, p.SendingCount AS MailCount
        FROM @Pair AS p
    ) AS d
    ORDER BY d.AccountName, d.RunMode, d.Status;
    SELECT
        p.AccountName,
        p.RunMode,
        p.DueCount,
        CAST(IIF(a.BlockedUntilUtc > @Now, 1, 0) AS BIT) AS IsBlocked,
        IIF(a.BlockedUntilUtc > @Now, CAST(0 AS BIGINT), p.DueCount) AS SendableCount,
        IIF(a.BlockedUntilUtc > @Now, NULL, p.OldestDueUtc) AS OldestSendableUtc,
        IIF(
            a.BlockedUntilUtc > @Now OR p.OldestDueUtc IS NULL,
            CAST(0 AS BIGINT),
            DATEDIFF_BIG(SECOND, p.OldestDueUtc, @Now)
        ) AS OldestSendableAgeSeconds
    FROM @Pair AS p
    INNER JOIN mailq.SendingAccount AS a ON p.AccountName = a.AccountName
    ORDER BY p.AccountName, p.RunMode;
    SELECT
        a.AccountName,
        CAST(IIF(a.BlockedUntilUtc > @Now, 1, 0) AS BIT) AS IsBlocked,
        a.BlockedUntilUtc,
        IIF(a.BlockedUntilUtc > @Now, DATEDIFF_BIG(SECOND, @Now, a.BlockedUntilUtc), CAST(0 AS BIGINT))
        AS BlockedSecondsLeft,
        IIF(a.BlockedUntilUtc > @Now, a.BlockReason, NULL) AS BlockReason,
        a.PerMinuteLimit,
        a.PerHourLimit,
        a.PerDayLimit
    FROM mailq.SendingAccount AS a
    ORDER BY a.AccountName;
    -- A range seek on IX_MailAttempt_EndedAtUtc (the explicit IS NOT NULL lets
    -- the hint match its filter), one PK seek per attempt for the account.
    SELECT
        m.MinuteUtc,
        q.AccountName,
        m.Outcome,
        m.ReplyClass,
        COUNT_BIG(*) AS Attempts
    FROM (
        SELECT
            t.MailID,
            t.Outcome,
            DATEADD(MINUTE, DATEDIFF(MINUTE, '20000101', t.EndedAtUtc), CAST('20000101' AS DATETIME2(0)))
            AS MinuteUtc,
            IIF(t.SmtpCode IS NULL, N'none', CONCAT(t.SmtpCode / 100, N'xx')) AS ReplyClass
        FROM mailq.MailAttempt AS t WITH (INDEX (IX_MailAttempt_EndedAtUtc), FORCESEEK)
        WHERE
            t.EndedAtUtc IS NOT NULL
            AND t.EndedAtUtc >= @WindowStart
            AND t.EndedAtUtc < @WindowEnd
    ) AS m
    INNER JOIN mailq.MailQueue AS q ON m.MailID = q.ID
    GROUP BY m.MinuteUtc, q.AccountName, m.Outcome, m.ReplyClass
    ORDER BY m.MinuteUtc, q.AccountName, m.Outcome, m.ReplyClass;
    -- mailq.Suppression is small: one scan of its clustered key.
    SELECT s.AccountName, s.Reason, COUNT_BIG(*) AS Suppressed
    FROM mailq.Suppression AS s
    WHERE s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @Now
    GROUP BY s.AccountName, s.Reason
    ORDER BY s.AccountName, s.Reason;
END;
