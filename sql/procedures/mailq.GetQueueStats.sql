/*
mailq.GetQueueStats: the reporting views in one call (for `mailq-db stats`).
Parameters:  @RecentFailures INT 1-1000, default 20: rows of result set 4.
Result sets: 1. Status, AccountName, MailCount           (mailq.QueueCountsByStatus)
             2. AccountName, OldestDueUtc, OldestDueAgeSeconds, DueCount (mailq.OldestDueMail)
             3. HourUtc, AccountName, Sent, Failed       (mailq.ThroughputPerHour, last 24 h)
             4. ID, AttemptNo, AccountName, Status, Outcome, SmtpCode, LastError,
                DateProcessed                            (mailq.RecentFailures, newest first)
Errors:      50146 @RecentFailures out of range.
Transaction: reads only; opens none and leaves the caller's untouched.
Isolation:   sets READ COMMITTED itself: called from a SERIALIZABLE or
             REPEATABLE READ session it would otherwise hold range or shared
             locks on the queue until the caller's transaction ends; under
             READ_COMMITTED_SNAPSHOT the counts are a consistent snapshot per
             statement (no lock taken).
Lock order:  none (no locking reads).
Example:     EXEC mailq.GetQueueStats @RecentFailures = 10;
*/
CREATE OR ALTER PROCEDURE mailq.GetQueueStats
    @RecentFailures INT = 20
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    SET @RecentFailures = COALESCE(@RecentFailures, 20);
    IF @RecentFailures NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@RecentFailures must be 1-1000; got ', @RecentFailures, N'.');
        THROW 50146, @Msg, 1;
    END;

    SELECT
        c.Status,
        c.AccountName,
        c.MailCount
    FROM mailq.QueueCountsByStatus AS c
    ORDER BY c.AccountName, c.Status;

    SELECT
        o.AccountName,
        o.OldestDueUtc,
        o.OldestDueAgeSeconds,
        o.DueCount
    FROM mailq.OldestDueMail AS o
    ORDER BY o.OldestDueAgeSeconds DESC;

    SELECT
        t.HourUtc,
        t.AccountName,
        t.Sent,
        t.Failed
    FROM mailq.ThroughputPerHour AS t
    WHERE t.HourUtc >= DATEADD(HOUR, -24, SYSUTCDATETIME())
    ORDER BY t.HourUtc DESC, t.AccountName ASC;

    SELECT TOP (@RecentFailures)
        f.ID,
        f.AttemptNo,
        f.AccountName,
        f.Status,
        f.Outcome,
        f.SmtpCode,
        f.LastError,
        f.DateProcessed
    FROM mailq.RecentFailures AS f
    ORDER BY f.DateProcessed DESC;
END;
