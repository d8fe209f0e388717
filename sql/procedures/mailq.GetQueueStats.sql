/*
mailq.GetQueueStats: the queue's health in one call (`mailq-db stats`), by forced
seeks bounded by queued mail or a time window, never by the history kept.
Parameters:  @RecentFailures INT 1-1000 = 20: rows of result set 4;
             @FinishedHours  INT 1-168 = 24: the window of result set 3.
Result sets: 1. Status, AccountName, MailCount: mail queued now (UnSent, Sending)
             2. AccountName, OldestDueUtc, OldestDueAgeSeconds, DueCount: due UnSent
                mail per account
             3. HourUtc, AccountName, Sent, Failed, Expired, Cancelled, Stopped: mail
                finished per UTC hour over the last @FinishedHours hours
             4. ID, AttemptNo, AccountName, Status, Outcome, SmtpCode, LastError,
                DateProcessed: the newest failed attempts of the last 7 days
Errors:      50146 @RecentFailures out of range; 50520 @FinishedHours out of range.
Transaction: reads only; opens none.
Isolation:   READ COMMITTED, set here (no locks kept for a SERIALIZABLE caller).
Lock order:  none (shared locks released row by row, or none under RCSI).
Example:     EXEC mailq.GetQueueStats @RecentFailures = 10, @FinishedHours = 24;
*/
CREATE OR ALTER PROCEDURE mailq.GetQueueStats
    @RecentFailures INT = 20,
    @FinishedHours INT = 24
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @RecentFailures = COALESCE(@RecentFailures, 20);
    SET @FinishedHours = COALESCE(@FinishedHours, 24);
    IF @RecentFailures NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@RecentFailures must be 1-1000; got ', @RecentFailures, N'.');
        THROW 50146, @Msg, 1;
    END;
    IF @FinishedHours NOT BETWEEN 1 AND 168
    BEGIN
        SET @Msg = CONCAT(N'@FinishedHours must be 1-168 (a week); got ', @FinishedHours, N'.');
        THROW 50520, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    -- Whole hours: the window starts at the top of the oldest hour shown.
    DECLARE @FinishedSince DATETIME2(3) = DATEADD(
        HOUR, DATEDIFF(HOUR, '20000101', @Now) - @FinishedHours + 1, CAST('20000101' AS DATETIME2(3))
    );
    DECLARE @FailuresSince DATETIME2(3) = DATEADD(DAY, -7, @Now);
    SELECT
        q.Status,
        q.AccountName,
        COUNT_BIG(*) AS MailCount
    FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Status), FORCESEEK)
    WHERE q.Status IN (N'UnSent', N'Sending')
    GROUP BY q.Status, q.AccountName
    ORDER BY q.AccountName ASC, q.Status ASC;
    SELECT
        q.AccountName,
        MIN(q.VisibleAtUtc) AS OldestDueUtc,
        DATEDIFF_BIG(SECOND, MIN(q.VisibleAtUtc), @Now) AS OldestDueAgeSeconds,
        COUNT_BIG(*) AS DueCount
    FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Status), FORCESEEK)
    WHERE q.Status = N'UnSent' AND q.VisibleAtUtc <= @Now
    GROUP BY q.AccountName
    ORDER BY OldestDueAgeSeconds DESC;
    -- The final statuses as literals, so the filtered IX_MailQueue_Final matches.
    -- RECOMPILE: the hash or sort grant follows the window's rows, not a fixed 30%
    -- of the history (local variable estimate).
    SELECT
        DATEADD(HOUR, DATEDIFF(HOUR, '20000101', q.DateProcessed), CAST('20000101' AS DATETIME2(0))) AS HourUtc,
        q.AccountName,
        SUM(IIF(q.Status = N'Sent', 1, 0)) AS Sent,
        SUM(IIF(q.Status = N'Failed', 1, 0)) AS Failed,
        SUM(IIF(q.Status = N'Expired', 1, 0)) AS Expired,
        SUM(IIF(q.Status = N'Cancelled', 1, 0)) AS Cancelled,
        SUM(IIF(q.Status = N'Stopped', 1, 0)) AS Stopped
    FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Final), FORCESEEK)
    WHERE
        q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
        AND q.DateProcessed >= @FinishedSince
    GROUP BY
        DATEADD(HOUR, DATEDIFF(HOUR, '20000101', q.DateProcessed), CAST('20000101' AS DATETIME2(0))),
        q.AccountName
    ORDER BY HourUtc DESC, q.AccountName ASC
    OPTION (RECOMPILE);
    -- A backward range seek on EndedAtUtc, stopped after @RecentFailures rows.
    SELECT TOP (@RecentFailures)
        t.MailID AS ID,
        t.AttemptNo,
        q.AccountName,
        q.Status,
        t.Outcome,
        t.SmtpCode,
        t.ErrorText AS LastError,
        t.EndedAtUtc AS DateProcessed
    FROM mailq.MailAttempt AS t WITH (INDEX (IX_MailAttempt_EndedAtUtc), FORCESEEK)
    INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID))) ON t.MailID = q.ID
    WHERE
        t.EndedAtUtc IS NOT NULL
        AND t.EndedAtUtc >= @FailuresSince
        AND t.Outcome IN (N'Retry', N'Wait', N'Stop', N'Abandoned')
    ORDER BY t.EndedAtUtc DESC;
END;
