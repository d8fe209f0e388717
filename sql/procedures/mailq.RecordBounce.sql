/*
mailq.RecordBounce: records what one delivery report says about its recipients
(`mailq-db bounces`), once per (report, address), and suppresses the addresses
that reached their limit: per new recipient a mailq.BounceReport row; with a
known mail an event (Bounced, BounceDelayed, Complained) and, for Hard and Soft,
the outcome Refused; a suppression (mailq.ApplySuppressions, account-wide) for a
Complaint at once, for Hard at @HardBounceLimit distinct mails, for Soft at
@SoftBounceLimit when set.  Delayed never suppresses.  A report read again changes nothing.
Parameters:  @ReportKey VARBINARY(32), required: SHA-256 of the report's Message-ID
             (else of its bytes); @Recipients NVARCHAR(MAX), required: JSON array of
             1-1000 {"address", "kind": Hard|Soft|Delayed|Complaint, "action",
             "status", "code" (200-599 or null), "detail"}; "address" may be left out
             (or be a forwarding alias) when @RecipientNo names the recipient;
             @Source NVARCHAR(200), required; @AccountName: the account when no mail
             is known (a known mail's account wins); @MailID BIGINT, @RecipientNo INT:
             from the verified VERP token (a purged mail counts as unknown);
             @HardBounceLimit INT 1-100 = 1; @SoftBounceLimit INT 1-100 = NULL (never).
Result set:  per recipient: Address, Kind, MailID, Recorded BIT (0: already
             recorded), Suppressed BIT (by this call).
Errors:      50601 no known mail and no valid @AccountName; 50602 a recipient
             without a valid address and no @RecipientNo; 50604 @Source; 50607
             @ReportKey not 32 bytes; 50608 a kind; 50609 @Recipients not a JSON
             array of 1-1000 objects; 50610 a limit out of range (50601, 50604,
             50607, 50609, 50610 checked by mailq.CheckBounceReport, before any write).
Transaction: its own if none is open, else the caller's; an error dooms either.
Isolation:   READ COMMITTED; the report key WITH (UPDLOCK, HOLDLOCK): two readers
             of one report record it once.
Lock order:  mailq.BounceReport, then mailq.ApplySuppressions's order, then the
             mail's row (mailq.MailQueue), mailq.MailRecipientOutcome, mailq.MailEvent.
Example:     EXEC mailq.RecordBounce @ReportKey = @Key, @Source = N'imap:bounces@example.com',
                 @MailID = 101, @Recipients = N'[{"address":"a@example.com","kind":"Hard"}]';
*/
CREATE OR ALTER PROCEDURE mailq.RecordBounce
    @ReportKey VARBINARY(32),
    @Recipients NVARCHAR(MAX),
    @Source NVARCHAR(200),
    @AccountName NVARCHAR(128) = NULL,
    @MailID BIGINT = NULL,
    @RecipientNo INT = NULL,
    @HardBounceLimit INT = 1,
    @SoftBounceLimit INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @HardBounceLimit = ISNULL(@HardBounceLimit, 1);
    DECLARE @Account NVARCHAR(128), @App NVARCHAR(128), @To NVARCHAR(4000), @CC NVARCHAR(4000),
        @BCC NVARCHAR(4000), @KnownMail BIGINT, @TokenAddress NVARCHAR(320);
    EXEC mailq.CheckBounceReport
        @ReportKey = @ReportKey,
        @Recipients = @Recipients,
        @Source = @Source,
        @AccountName = @AccountName,
        @MailID = @MailID,
        @RecipientNo = @RecipientNo,
        @HardBounceLimit = @HardBounceLimit,
        @SoftBounceLimit = @SoftBounceLimit,
        @KnownMail = @KnownMail OUTPUT,
        @Account = @Account OUTPUT,
        @App = @App OUTPUT,
        @To = @To OUTPUT,
        @CC = @CC OUTPUT,
        @BCC = @BCC OUTPUT,
        @TokenAddress = @TokenAddress OUTPUT;
    DECLARE @R TABLE (
        Address NVARCHAR(400) NULL,
        Kind NVARCHAR(16) NULL,
        Action NVARCHAR(16) NULL,
        Status NVARCHAR(16) NULL,
        SmtpCode INT NULL,
        Detail NVARCHAR(1000) NULL,
        Nth BIGINT NOT NULL
    );
    INSERT INTO @R (Address, Kind, Action, Status, SmtpCode, Detail, Nth)
    SELECT
        v.Address, v.Kind, v.Action, v.Status, v.SmtpCode, v.Detail,
        ROW_NUMBER() OVER (PARTITION BY v.Address ORDER BY v.Ordinal) AS Nth
    FROM (
        SELECT
            CAST(j.[key] AS INT) AS Ordinal,
            LEFT(LOWER(LTRIM(RTRIM(COALESCE(JSON_VALUE(j.[value], N'$.address'), @TokenAddress)))), 400) AS Address,
            LEFT(JSON_VALUE(j.[value], N'$.kind'), 16) AS Kind,
            LEFT(LOWER(JSON_VALUE(j.[value], N'$.action')), 16) AS Action,
            LEFT(JSON_VALUE(j.[value], N'$.status'), 16) AS Status,
            IIF(
                TRY_CAST(JSON_VALUE(j.[value], N'$.code') AS INT) BETWEEN 200 AND 599,
                TRY_CAST(JSON_VALUE(j.[value], N'$.code') AS INT), NULL
            ) AS SmtpCode,
            LEFT(JSON_VALUE(j.[value], N'$.detail'), 1000) AS Detail
        FROM OPENJSON(@Recipients) AS j
    ) AS v;
    -- A report about one recipient that is not among the mail's (a forwarding
    -- alias: the Final-Recipient after expansion) is about the address the
    -- token names: that is the one the queue sent to and must suppress.
    IF @TokenAddress IS NOT NULL AND (SELECT COUNT(*) FROM @R) = 1
        UPDATE r
        SET r.Address = @TokenAddress
        FROM @R AS r
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.MailRecipientList(@To, @CC, @BCC) AS l
            WHERE l.Address = r.Address
        );
    SELECT TOP (1) @Msg = CONCAT(N'@Recipients: ',
        COALESCE(N'''' + r.Address + N'''', N'a recipient without "address"'),
        N' is not one address of 1-320 characters',
        IIF(r.Address IS NULL, N', and @RecipientNo names no recipient of a queued mail', N''), N'.')
    FROM @R AS r
    WHERE r.Address IS NULL OR LEN(r.Address) > 320 OR r.Address NOT LIKE N'%_@_%' OR r.Address LIKE N'%@%@%';
    IF @Msg IS NOT NULL THROW 50602, @Msg, 1;
    SELECT TOP (1) @Msg = CONCAT(N'@Recipients: the kind of ', r.Address, N' is ',
        COALESCE(N'''' + r.Kind + N'''', N'missing'), N'; it must be Hard, Soft, Delayed or Complaint.')
    FROM @R AS r
    WHERE r.Kind IS NULL OR r.Kind NOT IN (N'Hard', N'Soft', N'Delayed', N'Complaint');
    IF @Msg IS NOT NULL THROW 50608, @Msg, 1;
    DELETE FROM @R WHERE Nth > 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @New TABLE (Address NVARCHAR(320) NOT NULL PRIMARY KEY);
    DECLARE @Suppress TABLE (Address NVARCHAR(320) NOT NULL PRIMARY KEY, Reason NVARCHAR(16) NOT NULL);
    DECLARE @Suppressions NVARCHAR(MAX), @Status NVARCHAR(16), @AttemptCount INT;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- 1. The idempotency key: (report, address) recorded once.
        INSERT INTO mailq.BounceReport (
            ReportKey, Address, AccountName, AppName, MailID, Kind, Action, Status, SmtpCode, Detail, Source,
            ReceivedAtUtc
        )
        OUTPUT inserted.Address INTO @New (Address)
        SELECT
            @ReportKey, r.Address, @Account, @App, @KnownMail, r.Kind, r.Action, r.Status, r.SmtpCode, r.Detail,
            @Source, @Now
        FROM @R AS r
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.BounceReport AS b WITH (UPDLOCK, HOLDLOCK)
            WHERE b.ReportKey = @ReportKey AND b.Address = r.Address
        );
        -- 2. Which of the new ones reach their limit (the counts include them): one per mail, so two
        --    reports of one bounce (a DSN and an SES notification) count once; a report without mail counts alone.
        INSERT INTO @Suppress (Address, Reason)
        SELECT
            r.Address,
            CASE r.Kind WHEN N'Complaint' THEN N'Complaint' WHEN N'Hard' THEN N'HardBounce' ELSE N'SoftBounce' END
        FROM @R AS r
        INNER JOIN @New AS n ON r.Address = n.Address
        WHERE
            r.Kind = N'Complaint'
            OR (r.Kind = N'Hard' AND (
                SELECT COUNT(DISTINCT COALESCE(CAST(b.MailID AS VARBINARY(8)), b.ReportKey))
                FROM mailq.BounceReport AS b
                WHERE b.AccountName = @Account AND b.Address = r.Address AND b.Kind = N'Hard'
            ) >= @HardBounceLimit)
            OR (r.Kind = N'Soft' AND @SoftBounceLimit IS NOT NULL AND (
                SELECT COUNT(DISTINCT COALESCE(CAST(b.MailID AS VARBINARY(8)), b.ReportKey))
                FROM mailq.BounceReport AS b
                WHERE b.AccountName = @Account AND b.Address = r.Address AND b.Kind = N'Soft'
            ) >= @SoftBounceLimit);
        IF EXISTS (SELECT 1 FROM @Suppress)
        BEGIN
            SET @Suppressions = (
                SELECT
                    @Account AS AccountName,
                    s.Address,
                    s.Reason,
                    @Source AS Source,
                    LEFT(CONCAT(r.Kind, N' ', r.Status, N': ', r.Detail), 1000) AS Detail,
                    @KnownMail AS MailID
                FROM @Suppress AS s
                INNER JOIN @R AS r ON s.Address = r.Address
                FOR JSON PATH
            );
            EXEC mailq.ApplySuppressions @Suppressions = @Suppressions;
        END;
        -- 3. The reported mail: its recipients' outcomes and its events.
        IF @KnownMail IS NOT NULL AND EXISTS (SELECT 1 FROM @New)
        BEGIN
            SELECT @Status = q.Status, @AttemptCount = q.AttemptCount
            FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
            WHERE q.ID = @KnownMail;
            UPDATE o
            SET
                o.Outcome = N'Refused',
                o.SmtpCode = r.SmtpCode,
                o.SmtpText = LEFT(CONCAT(N'bounced later (', r.Status, N'): ', r.Detail), 1000),
                o.UpdatedAtUtc = @Now
            FROM mailq.MailRecipientOutcome AS o
            INNER JOIN @R AS r ON o.Address = r.Address
            INNER JOIN @New AS n ON r.Address = n.Address
            WHERE o.MailID = @KnownMail AND r.Kind IN (N'Hard', N'Soft');
            INSERT INTO mailq.MailRecipientOutcome (
                MailID, Address, Outcome, SmtpCode, SmtpText, AttemptNo, UpdatedAtUtc
            )
            SELECT
                @KnownMail, r.Address, N'Refused', r.SmtpCode,
                LEFT(CONCAT(N'bounced later (', r.Status, N'): ', r.Detail), 1000), @AttemptCount, @Now
            FROM @R AS r
            INNER JOIN @New AS n ON r.Address = n.Address
            WHERE
                r.Kind IN (N'Hard', N'Soft')
                AND NOT EXISTS (
                    SELECT 1
                    FROM mailq.MailRecipientOutcome AS o
                    WHERE o.MailID = @KnownMail AND o.Address = r.Address
                );
            INSERT INTO mailq.MailEvent (
                MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc
            )
            SELECT
                @KnownMail, @App,
                CASE r.Kind WHEN N'Delayed' THEN N'BounceDelayed' WHEN N'Complaint' THEN N'Complained'
                    ELSE N'Bounced' END,
                @Status, @AttemptCount, r.SmtpCode,
                LEFT(CONCAT(r.Address, N': ', r.Kind, N' ', r.Status, N' ', r.Detail), 4000), @Now
            FROM @R AS r
            INNER JOIN @New AS n ON r.Address = n.Address;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        r.Address,
        r.Kind,
        @KnownMail AS MailID,
        CAST(IIF(n.Address IS NULL, 0, 1) AS BIT) AS Recorded,
        CAST(IIF(s.Address IS NULL, 0, 1) AS BIT) AS Suppressed
    FROM @R AS r
    LEFT JOIN @New AS n ON r.Address = n.Address
    LEFT JOIN @Suppress AS s ON r.Address = s.Address
    ORDER BY r.Address;
END;
