/*
mailq.GetSuppressionStats: what `mailq-db stats` and `mailq-db doctor` show
about bounces and suppressions.
Parameters:  @Days INT 1-366, default 7: the window of the report counts.
Result sets: 1. active suppressions: AccountName, Reason, Suppressed INT
                (one scan of mailq.Suppression: a report, not a hot path);
             2. reports recorded in the last @Days days: AccountName, Kind,
                Reports INT, Mails INT (distinct mails they were tied to),
                LastAtUtc (a range seek on IX_BounceReport_ReceivedAtUtc);
             3. mail Sent in the same window, the denominator of bounce and
                complaint rates: AccountName, Sent INT (a range seek on
                IX_MailQueue_Final by DateProcessed, covering).
Errors:      50614 @Days out of range.
Transaction: none of its own; reads only.
Isolation:   sets READ COMMITTED itself (no key-range locks under a SERIALIZABLE
             caller, no stale snapshot under SNAPSHOT; a report, locks kept by none).
Lock order:  mailq.Suppression, mailq.BounceReport, then mailq.MailQueue.
Example:     EXEC mailq.GetSuppressionStats @Days = 1;
*/
CREATE OR ALTER PROCEDURE mailq.GetSuppressionStats
    @Days INT = 7
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @Days = ISNULL(@Days, 7);
    IF @Days NOT BETWEEN 1 AND 366
    BEGIN
        SET @Msg = CONCAT(N'@Days must be 1-366; got ', @Days, N'.');
        THROW 50614, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Since DATETIME2(3) = DATEADD(DAY, -@Days, @Now);
    SELECT s.AccountName, s.Reason, COUNT(*) AS Suppressed
    FROM mailq.Suppression AS s
    WHERE s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @Now
    GROUP BY s.AccountName, s.Reason
    ORDER BY s.AccountName, s.Reason;
    SELECT
        b.AccountName,
        b.Kind,
        COUNT(*) AS Reports,
        COUNT(DISTINCT b.MailID) AS Mails,
        MAX(b.ReceivedAtUtc) AS LastAtUtc
    FROM mailq.BounceReport AS b
    WHERE b.ReceivedAtUtc >= @Since
    GROUP BY b.AccountName, b.Kind
    ORDER BY b.AccountName, b.Kind;
    SELECT q.AccountName, COUNT(*) AS Sent
    FROM mailq.MailQueue AS q
    WHERE
        q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')  -- IX_MailQueue_Final's filter
        AND q.DateProcessed >= @Since AND q.Status = N'Sent'
    GROUP BY q.AccountName
    ORDER BY q.AccountName;
END;
