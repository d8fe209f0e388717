/*
mailq.EnqueueMailRows: the one enqueue implementation (EnqueueMail, EnqueueMailBatch); internal, no grant.
Parameters:  @Rows mailq.MailBatchRow READONLY, @Mails (JSON), or @Single = 1 and one mail in
             @ToAddress ... @TemplateModel; @RejectInvalid BIT (batch): 1 queue the valid rows.
Results:     @Single = 1: the OUTPUTs, no result set; else EnqueueMailBatch's two result sets.
Errors:      @Single = 1: mailq.EnqueueMailCheck's number, 50600, 50162 (key lock); else 50220,
             50225 (key lock), 50224 (base64); all raised before any write.
Transaction: its own if none is open, else the caller's (also distributed); an error dooms it.
Isolation:   READ COMMITTED and the SET options of filtered-index DML, set here.
Lock order:  the keys' application locks (binary key order), mailq.Suppression (shared key ranges,
             held), mailq.MailQueue, mailq.MailAttachment, mailq.MailEvent.
Example:     EXEC mailq.EnqueueMailRows @Rows = @R, @RejectInvalid = 1;
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMailRows
    @Rows mailq.MailBatchRow READONLY,
    @Mails NVARCHAR(MAX) = NULL,
    @RejectInvalid BIT = 0,
    @Single BIT = 0,
    @ToAddress NVARCHAR(MAX) = NULL, @Subject NVARCHAR(MAX) = NULL, @Body NVARCHAR(MAX) = NULL,
    @BodyFormat NVARCHAR(20) = NULL, @TextBody NVARCHAR(MAX) = NULL, @CC NVARCHAR(MAX) = NULL,
    @BCC NVARCHAR(MAX) = NULL, @FromAddress NVARCHAR(MAX) = NULL, @FromName NVARCHAR(MAX) = NULL,
    @ReplyTo NVARCHAR(MAX) = NULL, @Headers NVARCHAR(MAX) = NULL, @AccountName NVARCHAR(4000) = NULL,
    @AppName NVARCHAR(4000) = NULL, @Priority INT = NULL, @DateToProcess DATETIME2(3) = NULL,
    @ExpiresAtUtc DATETIME2(3) = NULL, @MaxAttempts INT = NULL, @IdempotencyKey NVARCHAR(4000) = NULL,
    @Attachments NVARCHAR(MAX) = NULL, @RunMode NVARCHAR(4000) = NULL, @TemplateName NVARCHAR(4000) = NULL,
    @TemplateVersion INT = NULL, @TemplateModel NVARCHAR(MAX) = NULL,
    @MailID BIGINT = NULL OUTPUT,
    @MessageID NVARCHAR(255) = NULL OUTPUT,
    @Created BIT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- Filtered-index DML needs these at run time (else 1934); ARITHABORT follows ANSI_WARNINGS.
    SET ANSI_WARNINGS, ANSI_PADDING, CONCAT_NULL_YIELDS_NULL ON;
    SET NUMERIC_ROUNDABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @P NVARCHAR(1) = IIF(@Single = 1, N'@', N''), @Err INT, @Msg NVARCHAR(2048);
    DECLARE @User NVARCHAR(128) = USER_NAME();   -- the caller; MailqRunner in hooks and delayed targets
    DECLARE @PrincipalApp NVARCHAR(128) = (
        SELECT u.AppName FROM mailq.ApplicationPrincipal AS u WHERE u.PrincipalName = USER_NAME()
    );
    DECLARE @AllowUnmapped BIT = COALESCE(
        (SELECT p.AllowUnmappedEnqueuers FROM mailq.EnqueuePolicy AS p WHERE p.PolicyId = 1), 0
    );
    SET @RejectInvalid = IIF(@Single = 1, 0, COALESCE(@RejectInvalid, 0));
    DECLARE @Work TABLE (   -- NULL spelled out: the session's ANSI_NULL_DFLT_ON does not decide it
        RowNo INT NOT NULL PRIMARY KEY, ToAddress NVARCHAR(MAX) NULL, CC NVARCHAR(MAX) NULL, BCC NVARCHAR(MAX) NULL,
        Subject NVARCHAR(MAX) NULL, Body NVARCHAR(MAX) NULL, BodyFormat NVARCHAR(20) NULL, TextBody NVARCHAR(MAX) NULL,
        Headers NVARCHAR(MAX) NULL, FromAddress NVARCHAR(320) NULL, FromName NVARCHAR(200) NULL,
        ReplyTo NVARCHAR(MAX) NULL, AccountName NVARCHAR(128) NULL, AppName NVARCHAR(128) NULL, Priority INT NULL,
        DueUtc DATETIME2(3) NULL, ExpiresAtUtc DATETIME2(3) NULL, MaxAttempts INT NULL,
        IdempotencyKey NVARCHAR(4000) COLLATE Latin1_General_100_BIN2 NULL,
        KeyText NVARCHAR(4000) COLLATE Latin1_General_100_BIN2 NULL, Attachments NVARCHAR(MAX) NULL,
        RunMode NVARCHAR(4000) NULL, TemplateName NVARCHAR(4000) NULL, TemplateVersion INT NULL,
        TemplateModel NVARCHAR(MAX) NULL, ContentHash VARBINARY(32) NULL, MessageID NVARCHAR(255) NULL,
        ErrorNumber INT NULL, Field NVARCHAR(128) NULL, Message NVARCHAR(2048) NULL, KeyLeader INT NULL,
        KeySeq INT NULL INDEX IX_Work_KeySeq, MailID BIGINT NULL, Created BIT NULL, Suppressed NVARCHAR(MAX) NULL
    );
    DECLARE @Inserted TABLE (MailID BIGINT NOT NULL PRIMARY KEY, MessageID NVARCHAR(255) NOT NULL UNIQUE,
        AppName NVARCHAR(128) NULL);
    INSERT INTO @Work (
        RowNo, ToAddress, CC, BCC, Subject, Body, BodyFormat, TextBody, Headers, FromAddress, FromName, ReplyTo,
        AccountName, AppName, Priority, DueUtc, ExpiresAtUtc, MaxAttempts, IdempotencyKey, KeyText, Attachments,
        RunMode, TemplateName, TemplateVersion, TemplateModel, ContentHash, MessageID, ErrorNumber, Field, Message
    )
    SELECT
        i.RowNo, i.ToAddress, i.CC, i.BCC, c.Subject, c.Body, c.BodyFormat, i.TextBody, i.Headers, c.FromAddress,
        c.FromName, c.ReplyTo, c.AccountName, c.AppName, c.Priority, c.DueUtc, i.ExpiresAtUtc, c.MaxAttempts,
        i.IdempotencyKey, c.KeyText, i.Attachments, c.RunMode, i.TemplateName, i.TemplateVersion, c.TemplateModel,
        c.ContentHash, CONCAT(N'<', LOWER(CONVERT(NCHAR(36), NEWID())), N'@', c.Domain, N'>'),
        c.ErrorNumber, c.Field, LEFT(c.Message, 2048)
    FROM (
        SELECT
            r.RowNo, r.ToAddress, r.Subject, r.Body, r.BodyFormat, r.TextBody, r.CC, r.BCC, r.FromAddress,
            r.FromName, r.ReplyTo, r.Headers, r.AccountName, r.AppName, r.Priority, r.DateToProcess,
            r.ExpiresAtUtc, r.MaxAttempts, r.IdempotencyKey, r.Attachments, r.RunMode, r.TemplateName,
            r.TemplateVersion, r.TemplateModel, CAST(NULL AS NVARCHAR(128)) AS InputField,
            CAST(NULL AS NVARCHAR(2048)) AS InputMessage
        FROM @Rows AS r
        UNION ALL
        SELECT
            1, @ToAddress, @Subject, @Body, @BodyFormat, @TextBody, @CC, @BCC, @FromAddress, @FromName, @ReplyTo,
            @Headers, @AccountName, @AppName, @Priority, @DateToProcess, @ExpiresAtUtc, @MaxAttempts,
            @IdempotencyKey, @Attachments, @RunMode, @TemplateName, @TemplateVersion, @TemplateModel, NULL, NULL
        WHERE @Single = 1
        UNION ALL
        SELECT
            j.RowNo, j.ToAddress, j.Subject, j.Body, j.BodyFormat, j.TextBody, j.CC, j.BCC, j.FromAddress,
            j.FromName, j.ReplyTo, j.Headers, j.AccountName, j.AppName, j.Priority, j.DateToProcess,
            j.ExpiresAtUtc, j.MaxAttempts, j.IdempotencyKey, j.Attachments, j.RunMode, j.TemplateName,
            j.TemplateVersion, j.TemplateModel, j.InputField, j.InputMessage
        FROM mailq.MailBatchJson(@Mails) AS j
    ) AS i
    OUTER APPLY (
        SELECT t.LatestVersion, t.RetiredAtUtc
        FROM mailq.MailTemplate AS t WHERE t.TemplateName = LEFT(i.TemplateName, 128)
    ) AS m
    CROSS APPLY mailq.EnqueueMailCheck(
        i.ToAddress, i.Subject, i.Body, i.BodyFormat, i.TextBody, i.CC, i.BCC, i.FromAddress, i.FromName,
        i.ReplyTo, i.Headers, i.AccountName, i.AppName, i.Priority, i.DateToProcess, i.ExpiresAtUtc,
        i.MaxAttempts, i.IdempotencyKey, i.Attachments, i.RunMode, i.TemplateName, i.TemplateVersion,
        i.TemplateModel, i.InputField, i.InputMessage, @P, @Now, @User, @PrincipalApp, @AllowUnmapped,
        m.LatestVersion, m.RetiredAtUtc
    ) AS c;
    UPDATE w
    SET w.KeyLeader = l.Leader, w.KeySeq = IIF(w.RowNo = l.Leader, l.Seq, NULL)
    FROM @Work AS w
    INNER JOIN (
        SELECT v.KeyText, MIN(v.RowNo) AS Leader, ROW_NUMBER() OVER (ORDER BY v.KeyText) AS Seq
        FROM @Work AS v
        WHERE v.KeyText IS NOT NULL AND v.ErrorNumber IS NULL
        GROUP BY v.KeyText
    ) AS l ON w.KeyText = l.KeyText
    WHERE w.ErrorNumber IS NULL;
    UPDATE f
    SET f.ErrorNumber = 50116, f.Field = N'IdempotencyKey', f.Message = CONCAT(N'IdempotencyKey ''',
        LEFT(f.IdempotencyKey, 200), N''' is used by row ', l.RowNo, N' of this batch with different content; ',
        N'use a new key for a different mail.')
    FROM @Work AS f
    INNER JOIN @Work AS l ON f.KeyLeader = l.RowNo
    WHERE f.RowNo <> l.RowNo AND f.ContentHash <> l.ContentHash;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0), @Bad INT = (
        SELECT COUNT(*) FROM @Work AS w WHERE w.ErrorNumber IS NOT NULL
    );
    DECLARE @Seq INT = 0, @Keys INT = (SELECT MAX(w.KeySeq) FROM @Work AS w), @Lock INT;
    DECLARE @KeyText NVARCHAR(200), @Resource NVARCHAR(255);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- 3. Keys on exclusive transaction-owned applocks, binary key order (no key-range locks).
        WHILE @Seq < COALESCE(@Keys, 0) AND (@RejectInvalid = 1 OR @Bad = 0)
        BEGIN
            SET @Seq += 1;
            SET @KeyText = (SELECT w.KeyText FROM @Work AS w WHERE w.KeySeq = @Seq);
            SET @Resource = CONCAT(N'mailq.IdempotencyKey:', @KeyText);
            EXEC @Lock = sys.sp_getapplock
                @Resource = @Resource, @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 10000;
            IF @Lock < 0
            BEGIN
                SELECT
                    @Err = IIF(@Single = 1, 50162, 50225),
                    @Msg = CONCAT(@P, N'IdempotencyKey ''', @KeyText, N''': another transaction enqueueing the same ',
                        N'key held it for 10 s (sp_getapplock returned ', @Lock, N'); retry once it committed.');
                THROW @Err, @Msg, 1;
            END;
        END;
        -- 4. Keys already queued, exact under the locks; FORCESEEK on UX_MailQueue_IdempotencyKey.
        UPDATE w
        SET w.MailID = q.ID, w.MessageID = q.MessageID, w.Created = 0,
            w.ErrorNumber = IIF(q.ContentHash = w.ContentHash, NULL, 50116),
            w.Field = IIF(q.ContentHash = w.ContentHash, NULL, N'IdempotencyKey'),
            w.Message = IIF(q.ContentHash = w.ContentHash, NULL, CONCAT(@P, N'IdempotencyKey ''', w.KeyText,
                N''' already belongs to mail ', q.ID, N' with different content; use a new key for a different mail.'))
        FROM @Work AS w
        INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK)
            ON w.IdempotencyKey = q.IdempotencyKey AND q.IdempotencyKey IS NOT NULL
        WHERE w.KeySeq <= @Seq;
        -- Suppressed recipients: shared key-range locks on mailq.Suppression held to commit.
        UPDATE w
        SET w.ToAddress = ISNULL(f.ToAddress, N''), w.CC = f.CC, w.BCC = f.BCC, w.Suppressed = f.Suppressed,
            w.ErrorNumber = IIF(f.EntriesLeft = 0, 50600, NULL), w.Field = IIF(f.EntriesLeft = 0, N'ToAddress', NULL),
            w.Message = IIF(f.EntriesLeft = 0, LEFT(CONCAT(N'Every recipient is suppressed for account ''',
                w.AccountName, N''' (mailq.ListSuppressions): ', f.Suppressed), 2048), NULL)
        FROM @Work AS w
        CROSS APPLY mailq.FilterSuppressedRecipients(w.AccountName, w.AppName, w.ToAddress, w.CC, w.BCC) AS f
        WHERE w.ErrorNumber IS NULL AND w.MailID IS NULL AND (w.KeyLeader IS NULL OR w.KeySeq IS NOT NULL)
            AND f.SuppressedCount > 0;
        UPDATE f
        SET f.ErrorNumber = l.ErrorNumber, f.Field = l.Field, f.Message = l.Message
        FROM @Work AS f
        INNER JOIN @Work AS l ON f.KeyLeader = l.RowNo
        WHERE f.RowNo <> l.RowNo AND f.ErrorNumber IS NULL AND l.ErrorNumber IS NOT NULL;
        SET @Bad = (SELECT COUNT(*) FROM @Work AS w WHERE w.ErrorNumber IS NOT NULL);
        IF @RejectInvalid = 0 AND @Bad > 0
        BEGIN
            SELECT TOP (1)
                @Err = IIF(@Single = 1, w.ErrorNumber, 50220),
                @Msg = IIF(@Single = 1, w.Message, LEFT(CONCAT(N'Row ', w.RowNo, N', field ', w.Field, N', rule ',
                    w.ErrorNumber, N': ', w.Message, IIF(@Bad > 1, CONCAT(N' (', @Bad - 1, N' other rows are ',
                    N'invalid too; @RejectInvalid = 1 lists them all.)'), N''), N' Nothing was queued.'), 2048))
            FROM @Work AS w
            WHERE w.ErrorNumber IS NOT NULL
            ORDER BY w.RowNo;
            THROW @Err, @Msg, 1;
        END;
        -- 6. One INSERT, IDs in RowNo order (INSERT ... SELECT ... ORDER BY); MessageID maps them back.
        INSERT INTO mailq.MailQueue (
            dtStamp, DateToProcess, VisibleAtUtc, FromName, FromAddress, ReplyTo, ToAddress, CC, BCC, Subject,
            Body, BodyFormat, TextBody, Headers, Status, AttemptsRemaining, Priority, AccountName, AppName,
            IdempotencyKey, ContentHash, MessageID, ExpiresAtUtc, RunMode, TemplateName, TemplateVersion, TemplateModel
        )
        OUTPUT inserted.ID, inserted.MessageID, inserted.AppName INTO @Inserted (MailID, MessageID, AppName)
        SELECT
            @Now, w.DueUtc AS DateToProcess, w.DueUtc AS VisibleAtUtc, w.FromName, w.FromAddress, w.ReplyTo,
            ISNULL(w.ToAddress, N''), w.CC, w.BCC, w.Subject, w.Body, w.BodyFormat, w.TextBody, w.Headers, N'UnSent',
            w.MaxAttempts, w.Priority, w.AccountName, w.AppName, w.IdempotencyKey, w.ContentHash, w.MessageID,
            w.ExpiresAtUtc, w.RunMode, w.TemplateName, w.TemplateVersion, w.TemplateModel
        FROM @Work AS w
        WHERE w.ErrorNumber IS NULL AND w.MailID IS NULL AND (w.KeyLeader IS NULL OR w.KeySeq IS NOT NULL)
        ORDER BY w.RowNo;
        UPDATE w SET w.MailID = i.MailID, w.Created = 1
        FROM @Work AS w INNER JOIN @Inserted AS i ON w.MessageID = i.MessageID;
        -- Only canonical base64 reaches the decoder, so it cannot fail.
        BEGIN TRY
            INSERT INTO mailq.MailAttachment (
                MailID, AttachmentNo, FileName, ContentType, Content, Generator, GeneratorArgs
            )
            SELECT
                w.MailID, t.AttachmentNo, LTRIM(RTRIM(t.FileName)),
                COALESCE(t.ContentType, N'application/octet-stream'), b.Content, t.Generator,
                IIF(t.Generator IS NULL, NULL, t.GeneratorArgs)
            FROM @Work AS w
            CROSS APPLY mailq.MailAttachmentList(w.Attachments) AS t
            OUTER APPLY OPENJSON (IIF(t.Base64Ok = 1, CONCAT(N'{"c":"', t.ContentBase64, N'"}'), NULL))
                WITH (Content VARBINARY(MAX) '$.c') AS b
            WHERE w.Created = 1;
        END TRY
        BEGIN CATCH
            SELECT
                @Err = IIF(@Single = 1, 50117, 50224),
                @Msg = CONCAT(@P, N'Attachments: a ContentBase64 could not be decoded (', ERROR_MESSAGE(), N').');
            THROW @Err, @Msg, 1;
        END CATCH;
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT i.MailID, i.AppName, e.EventType, N'UnSent', 0, NULL, e.Detail, @Now
        FROM @Inserted AS i
        INNER JOIN @Work AS w ON i.MailID = w.MailID
        CROSS APPLY (VALUES (1, N'Enqueued', NULL), (2, N'RecipientSuppressed',
            LEFT(CONCAT(N'not sent to (suppressed): ', w.Suppressed), 4000))) AS e(EventNo, EventType, Detail)
        WHERE e.EventNo = 1 OR w.Suppressed IS NOT NULL
        ORDER BY i.MailID, e.EventNo;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    UPDATE f SET f.MailID = l.MailID, f.MessageID = l.MessageID, f.Created = 0
    FROM @Work AS f
    INNER JOIN @Work AS l ON f.KeyLeader = l.RowNo
    WHERE f.RowNo <> l.RowNo AND f.ErrorNumber IS NULL;
    IF @Single = 1
        SELECT @MailID = w.MailID, @MessageID = w.MessageID, @Created = w.Created FROM @Work AS w;
    ELSE
    BEGIN
        SELECT w.RowNo, w.MailID, w.MessageID, w.Created FROM @Work AS w WHERE w.ErrorNumber IS NULL ORDER BY w.RowNo;
        SELECT w.RowNo, w.Field, w.ErrorNumber, w.Message
        FROM @Work AS w WHERE w.ErrorNumber IS NOT NULL ORDER BY w.RowNo;
    END;
END;
