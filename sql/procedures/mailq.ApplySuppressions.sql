/*
mailq.ApplySuppressions (internal: called by AddSuppression, RecordBounce and
RecordUnsubscribe; granted to nobody): adds or renews suppressions, then takes the
addresses out of the accounts' queued mail (IX_MailQueue_ClaimByAccount): UnSent
mail loses them from To/CC/BCC (event RecipientSuppressed), or is Stopped when
nobody is left; Sending mail keeps its lists and gets a Refused outcome per
address, so no later attempt sends to it.  ClaimMail is untouched.
Parameters:  @Suppressions NVARCHAR(MAX), required: JSON array of {"AccountName",
             "Address" (lower-case), "AppName" (null or "": every application),
             "Reason", "Source", "Detail", "MailID", "ExpiresAtUtc"}, validated by
             the callers; @SweptMails INT OUTPUT, @StoppedMails INT OUTPUT.
Result set:  none.  Errors: none of its own; SQL Server's are re-raised.
Transaction: its own if none is open, else the caller's; an error dooms either.
Isolation:   READ COMMITTED; suppression rows WITH (UPDLOCK, HOLDLOCK) so two
             writers of one address serialize; queued mail locked with UPDLOCK
             before it is read for the change.  DEADLOCK_PRIORITY LOW: the sweep,
             never a worker, is the victim.
Lock order:  mailq.Suppression, mailq.SuppressionHistory, mailq.MailQueue (U -> X),
             mailq.MailEvent, mailq.MailRecipientOutcome (docs/bounces.md).  An
             enqueue's shared key-range lock on the address makes the insert here
             wait for that mail to commit, then sweep it.
Example:     EXEC mailq.ApplySuppressions @Suppressions = N'[{"AccountName":"news",
                 "Address":"a@example.com","Reason":"Manual","Source":"dba"}]';
*/
CREATE OR ALTER PROCEDURE mailq.ApplySuppressions
    @Suppressions NVARCHAR(MAX),
    @SweptMails INT = NULL OUTPUT,
    @StoppedMails INT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SET DEADLOCK_PRIORITY LOW;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    SET @SweptMails = 0;
    SET @StoppedMails = 0;
    DECLARE @S TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        Reason NVARCHAR(16) NOT NULL,
        Source NVARCHAR(200) NOT NULL,
        Detail NVARCHAR(1000) NULL,
        MailID BIGINT NULL,
        ExpiresAtUtc DATETIME2(3) NULL,
        PRIMARY KEY (AccountName, Address, AppName)
    );
    -- JSON_VALUE per field (lax: a missing field is NULL); times as ISO 8601 (style 126)
    INSERT INTO @S (AccountName, Address, AppName, Reason, Source, Detail, MailID, ExpiresAtUtc)
    SELECT x.AccountName, x.Address, x.AppName, x.Reason, x.Source, x.Detail, x.MailID, x.ExpiresAtUtc
    FROM (
        SELECT
            v.AccountName,
            v.Address,
            v.AppName,
            v.Reason,
            v.Source,
            v.Detail,
            v.MailID,
            v.ExpiresAtUtc,
            ROW_NUMBER() OVER (PARTITION BY v.AccountName, v.Address, v.AppName ORDER BY v.Ordinal) AS Nth
        FROM (
            SELECT
                CAST(j.[key] AS INT) AS Ordinal,
                CAST(JSON_VALUE(j.[value], N'$.AccountName') AS NVARCHAR(128)) AS AccountName,
                CAST(LOWER(JSON_VALUE(j.[value], N'$.Address')) AS NVARCHAR(320)) AS Address,
                CAST(ISNULL(JSON_VALUE(j.[value], N'$.AppName'), N'') AS NVARCHAR(128)) AS AppName,
                CAST(JSON_VALUE(j.[value], N'$.Reason') AS NVARCHAR(16)) AS Reason,
                CAST(JSON_VALUE(j.[value], N'$.Source') AS NVARCHAR(200)) AS Source,
                CAST(LEFT(JSON_VALUE(j.[value], N'$.Detail'), 1000) AS NVARCHAR(1000)) AS Detail,
                TRY_CAST(JSON_VALUE(j.[value], N'$.MailID') AS BIGINT) AS MailID,
                TRY_CONVERT(DATETIME2(3), JSON_VALUE(j.[value], N'$.ExpiresAtUtc'), 126) AS ExpiresAtUtc
            FROM OPENJSON(@Suppressions) AS j
        ) AS v
    ) AS x
    WHERE x.Nth = 1;
    DECLARE @Changed TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        Action NVARCHAR(16) NOT NULL,
        Reason NVARCHAR(16) NOT NULL,
        Source NVARCHAR(200) NOT NULL,
        Detail NVARCHAR(1000) NULL,
        MailID BIGINT NULL
    );
    DECLARE @Mail TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Swept TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        Status NVARCHAR(16) NOT NULL,
        ToAddress NVARCHAR(MAX) NULL,
        CC NVARCHAR(MAX) NULL,
        BCC NVARCHAR(MAX) NULL,
        Suppressed NVARCHAR(MAX) NULL,
        EntriesLeft INT NOT NULL
    );
    DECLARE @Refuse TABLE (
        MailID BIGINT NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AttemptNo INT NOT NULL,
        PRIMARY KEY (MailID, Address)
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- 1. Renew what exists: the newest reason, source and detail; the
        --    longer of the two lifetimes (NULL = forever wins; an expired row
        --    takes the new expiry).  UPDLOCK, HOLDLOCK: see Isolation.
        UPDATE s
        SET
            s.Reason = i.Reason,
            s.Source = i.Source,
            s.Detail = i.Detail,
            s.MailID = COALESCE(i.MailID, s.MailID),
            s.UpdatedAtUtc = @Now,
            s.ExpiresAtUtc = CASE
                WHEN s.ExpiresAtUtc IS NULL OR i.ExpiresAtUtc IS NULL THEN NULL
                WHEN i.ExpiresAtUtc > s.ExpiresAtUtc THEN i.ExpiresAtUtc
                ELSE s.ExpiresAtUtc
            END
        OUTPUT
            inserted.AccountName, inserted.Address, inserted.AppName, N'Renewed', inserted.Reason,
            inserted.Source, inserted.Detail, inserted.MailID
        INTO @Changed (AccountName, Address, AppName, Action, Reason, Source, Detail, MailID)
        FROM mailq.Suppression AS s WITH (UPDLOCK, HOLDLOCK)
        INNER JOIN @S AS i ON s.AccountName = i.AccountName AND s.Address = i.Address AND s.AppName = i.AppName;
        -- 2. Add what is new (waits for enqueues that read this address's
        --    key range: they commit first and are swept below).
        INSERT INTO mailq.Suppression (
            AccountName, Address, AppName, Reason, Source, Detail, MailID, CreatedAtUtc, UpdatedAtUtc, ExpiresAtUtc
        )
        OUTPUT
            inserted.AccountName, inserted.Address, inserted.AppName, N'Added', inserted.Reason,
            inserted.Source, inserted.Detail, inserted.MailID
        INTO @Changed (AccountName, Address, AppName, Action, Reason, Source, Detail, MailID)
        SELECT i.AccountName, i.Address, i.AppName, i.Reason, i.Source, i.Detail, i.MailID, @Now, @Now, i.ExpiresAtUtc
        FROM @S AS i
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.Suppression AS s WITH (UPDLOCK, HOLDLOCK)
            WHERE s.AccountName = i.AccountName AND s.Address = i.Address AND s.AppName = i.AppName
        );
        INSERT INTO mailq.SuppressionHistory (
            AccountName, Address, AppName, Action, Reason, Source, Detail, MailID, OccurredAtUtc
        )
        SELECT c.AccountName, c.Address, c.AppName, c.Action, c.Reason, c.Source, c.Detail, c.MailID, @Now
        FROM @Changed AS c;
        -- 3. Candidates: queued mail of these accounts whose lists mention an
        --    address (a text probe; the exact test is step 5).  A range of
        --    IX_MailQueue_ClaimByAccount per account, no locks kept.
        INSERT INTO @Mail (ID)
        SELECT DISTINCT q.ID
        FROM mailq.MailQueue AS q
        INNER JOIN @S AS i ON q.AccountName = i.AccountName
        WHERE
            q.Status IN (N'UnSent', N'Sending')
            AND (i.AppName = N'' OR i.AppName = q.AppName)
            AND CHARINDEX(i.Address, LOWER(CONCAT(q.ToAddress, N';', q.CC, N';', q.BCC))) > 0;
        -- 4. Lock them (UPDLOCK reads the committed row even under
        --    READ_COMMITTED_SNAPSHOT) and 5. compute their lists without
        --    every address suppressed for them (mailq.Suppression now holds
        --    this call's rows too).
        INSERT INTO @Swept (ID, Status, ToAddress, CC, BCC, Suppressed, EntriesLeft)
        SELECT q.ID, q.Status, f.ToAddress, f.CC, f.BCC, f.Suppressed, f.EntriesLeft
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK, FORCESEEK)
        INNER JOIN @Mail AS m ON q.ID = m.ID
        CROSS APPLY mailq.FilterSuppressedRecipients(q.AccountName, q.AppName, q.ToAddress, q.CC, q.BCC) AS f
        WHERE q.Status IN (N'UnSent', N'Sending') AND f.SuppressedCount > 0;
        -- 6. UnSent with recipients left: the lists without them.
        UPDATE q
        SET
            q.ToAddress = ISNULL(w.ToAddress, N''),
            q.CC = w.CC,
            q.BCC = w.BCC
        OUTPUT
            inserted.ID, inserted.AppName, N'RecipientSuppressed', inserted.Status, inserted.AttemptCount,
            NULL, LEFT(CONCAT(N'not sent to (suppressed): ', w.Suppressed), 4000), @Now
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        INNER JOIN @Swept AS w ON q.ID = w.ID
        WHERE w.Status = N'UnSent' AND w.EntriesLeft > 0;
        SET @SweptMails = @@ROWCOUNT;
        -- 7. UnSent with nobody left: Stopped, as mailq.StopMail leaves it.
        UPDATE q
        SET
            q.Status = N'Stopped',
            q.DateProcessed = @Now,
            q.LastError = LEFT(CONCAT(N'every recipient is suppressed: ', w.Suppressed), 4000)
        OUTPUT
            inserted.ID, inserted.AppName, N'Stopped', inserted.Status, inserted.AttemptCount,
            NULL, inserted.LastError, @Now
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        INNER JOIN @Swept AS w ON q.ID = w.ID
        WHERE w.Status = N'UnSent' AND w.EntriesLeft = 0;
        SET @StoppedMails = @@ROWCOUNT;
        SET @SweptMails += @StoppedMails;
        -- 8. Sending: a Refused outcome per suppressed address, so a later
        --    attempt skips it (mailq.GetRecipientOutcomes); Delivered stays.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT
            q.ID, q.AppName, N'RecipientSuppressed', q.Status, q.AttemptCount, NULL,
            LEFT(CONCAT(N'not sent to (suppressed) after this attempt: ', w.Suppressed), 4000), @Now
        FROM @Swept AS w
        INNER JOIN mailq.MailQueue AS q ON w.ID = q.ID
        WHERE w.Status = N'Sending';
        SET @SweptMails += @@ROWCOUNT;
        INSERT INTO @Refuse (MailID, Address, AttemptNo)
        SELECT q.ID, CAST(r.Address AS NVARCHAR(320)), q.AttemptCount
        FROM @Swept AS w
        INNER JOIN mailq.MailQueue AS q ON w.ID = q.ID
        CROSS APPLY mailq.MailRecipientList(q.ToAddress, q.CC, q.BCC) AS r
        WHERE
            w.Status = N'Sending' AND r.IsFirst = 1 AND LEN(r.Address) <= 320
            AND EXISTS (
                SELECT 1
                FROM mailq.Suppression AS s
                WHERE
                    s.AccountName = q.AccountName AND s.Address = r.Address
                    AND s.AppName IN (N'', ISNULL(q.AppName, N''))
                    AND (s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @Now)
            );
        UPDATE o
        SET
            o.Outcome = N'Refused',
            o.SmtpCode = NULL,
            o.SmtpText = N'suppressed (mailq.Suppression)',
            o.UpdatedAtUtc = @Now
        FROM mailq.MailRecipientOutcome AS o
        INNER JOIN @Refuse AS f ON o.MailID = f.MailID AND o.Address = f.Address
        WHERE o.Outcome = N'Deferred';
        INSERT INTO mailq.MailRecipientOutcome (MailID, Address, Outcome, SmtpCode, SmtpText, AttemptNo, UpdatedAtUtc)
        SELECT f.MailID, f.Address, N'Refused', NULL, N'suppressed (mailq.Suppression)', f.AttemptNo, @Now
        FROM @Refuse AS f
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.MailRecipientOutcome AS o
            WHERE o.MailID = f.MailID AND o.Address = f.Address
        );
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
