/*
mailq.EnqueueMailBatch: validates and queues many mails in one call, row by
row with mailq.EnqueueMail's rules, written by one set-based INSERT.
Parameters:  @Mails     NVARCHAR(MAX): a JSON array of objects, one per mail,
                        whose fields are EnqueueMail's parameter names without
                        '@' (ToAddress, Subject, Body, BodyFormat, TextBody,
                        CC, BCC, FromAddress, FromName, ReplyTo, Headers,
                        AccountName, AppName, Priority, DateToProcess,
                        ExpiresAtUtc, MaxAttempts, IdempotencyKey,
                        Attachments, RunMode and (revision 0016) TemplateName,
                        TemplateVersion, TemplateModel); Headers, Attachments
                        and TemplateModel as JSON (an object / array) or as
                        the string EnqueueMail takes.  A lazy attachment
                        ("Generator") is EnqueueMail's only (50286 here);
                        times are UTC ISO 8601 ('2030-01-01T08:00:00', 'Z'
                        allowed, no other offset).  Row ordinal = position + 1.
             @MailRows  mailq.MailBatchRow READONLY: the same, as a
                        table-valued parameter (RowNo is the caller's ordinal).
                        Give exactly one of @Mails and @MailRows; 1-10,000 rows.
             @RejectInvalid BIT, default 0: 0 = all-or-nothing (any invalid
                        row raises 50220 and nothing is written); 1 = queue the
                        valid rows and return the invalid ones.
Result sets: 1. one row per queued (or idempotently returned) mail, in RowNo
                order: RowNo INT, MailID BIGINT, MessageID NVARCHAR(255),
                Created BIT (0 when an existing mail was returned for the key).
             2. the rejected rows (empty unless @RejectInvalid = 1): RowNo INT,
                Field NVARCHAR(128), ErrorNumber INT (the number EnqueueMail
                raises for that rule, 50101-50168 or 50600, or 50223), Message
                NVARCHAR(2048).  One row per rejected mail: its first failed
                rule in EnqueueMail's order, the rule EnqueueMail would raise.
Rules:       each row is checked with EnqueueMail's rules in EnqueueMail's
             order (recipients, subject, body, sizes, CR/LF, addresses,
             recipient count, body format, priority, attempts, expiry, body
             size, run mode (50240, revision 0015), headers JSON, caller's mapped application, account,
             application, account and From bindings, attachments, idempotency
             key), plus 50223 for a JSON field of the wrong type or an unknown
             field.  One difference: attachment content must be canonical
             base64 (A-Z a-z 0-9 + / and '=' padding, length a multiple of 4,
             no line breaks), because a decoding error inside one set-based
             statement cannot say which row caused it.
Idempotency: as EnqueueMail, and the content hash is computed exactly as
             EnqueueMail computes it (the fields as passed, before defaults),
             so a batch row and a single call with the same values are one
             mail.  A key already queued with the same content returns that
             mail (Created = 0); with different content the row fails with
             rule 50116.  Within the batch, the first valid row with a key
             creates the mail; later rows with the same key and content return
             it (Created = 0), with different content they fail with 50116.
Concurrency: EnqueueMail serializes each key on an exclusive, transaction-owned
             application lock 'mailq.IdempotencyKey:<key>' and relies on it
             ("only EnqueueMail writes keys, always under this lock").  This
             procedure keeps that invariant: inside its transaction, before it
             reads existing keys or inserts, it takes the SAME lock for every
             distinct key of the batch, in binary key order.  sp_getapplock
             locks one resource per call, so this is the one loop here, over
             distinct keys only (none for a batch without keys); the mails are
             still written by one INSERT.  Two batches lock shared keys in the
             same order and cannot deadlock on them; a batch and single calls
             hold at most one key per EnqueueMail call, but a caller's
             transaction holding several keys taken in another order can
             deadlock with a batch: the loser gets 50225 (retry).  A lock not
             granted in 10 s is 50225 as well.  Rows without a key take no
             lock and never wait for one another.
Escalation:  the mails are written by ONE statement, which locks each new row
             in every index of mailq.MailQueue.  From 5,000 locks on one index
             in one statement SQL Server would escalate to a table lock
             (Microsoft, "Lock escalation"), held until the transaction ends;
             revision 0018 disables escalation on mailq.MailQueue,
             mailq.MailAttachment and mailq.MailEvent, so a 10,000-mail batch
             keeps row locks on rows nobody else asks for (new rows) and
             claims, enqueues and acknowledgements go on.  Its price is lock
             memory (about one lock per new row and index, released at
             commit); keep the batch's transaction short all the same.
Input:       @Mails is at most 256 MB of text (DATALENGTH), @MailRows at
             most 256 MB over its text columns (50226); times are ISO 8601:
             "Z" or no offset is UTC, an offset ("+02:00") is converted to
             UTC; Priority and MaxAttempts are JSON numbers.
Errors:      50220 a row is invalid (all-or-nothing): the message names the row,
             the field and the rule (EnqueueMail's number) and how many other
             rows are invalid; nothing is written;
             50221 neither or both of @Mails and @MailRows, or @Mails not a
             JSON array of objects; 50222 no rows or more than 10,000;
             50224 an attachment's base64 passed the textual check but could
             not be decoded (row not identifiable; nothing written);
             50225 an idempotency key's lock was not granted in 10 s (or
             deadlock); 50226 the input is over 256 MB of text (split it).
             Rule 50600 (issue 28): every recipient of the row is suppressed
             (suppressed recipients of a row with others left are dropped with
             a RecipientSuppressed event, docs/bounces.md).
             Rule numbers inside 50220 / result set 2: see
             mailq.EnqueueMail and 50223 (a JSON field of the wrong type or
             an unknown field name).
Transaction: opens its own if none is open, else works inside the caller's
             (outbox: the mails exist exactly when the caller commits).  Any
             error is re-raised; XACT_ABORT ON rolls back or dooms the caller's
             transaction, as EnqueueMail's errors do.  @RejectInvalid = 1 does
             not raise for invalid rows, so the caller's transaction goes on.
Isolation:   sets READ COMMITTED itself (as EnqueueMail: no key-range locks
             under a SERIALIZABLE caller, no stale snapshot under SNAPSHOT).
Lock order:  the application locks on the keys (binary key order), then
             mailq.Suppression (shared key ranges of the recipients, held), then
             mailq.MailQueue (insert), then mailq.MailAttachment, as EnqueueMail
             (docs/guarantees.md, "Lock order"), then mailq.MailEvent (new
             rows only: the 'Enqueued' event of every created mail).
Example:     EXEC mailq.EnqueueMailBatch @Mails = N'[
                 {"ToAddress": "a@example.com", "Subject": "Hi", "Body": "One"},
                 {"ToAddress": "b@example.com", "Subject": "Hi", "Body": "Two", "Priority": 9}]';
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMailBatch
    @Mails NVARCHAR(MAX) = NULL,
    @MailRows mailq.MailBatchRow READONLY,
    @RejectInvalid BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Msg NVARCHAR(2048);
    DECLARE @MaxRows INT = 10000;
    DECLARE @MaxBatchBytes BIGINT = 268435456;   -- 256 MB of input text per call (50226)
    DECLARE @Bytes BIGINT;
    DECLARE @RowCount INT;
    -- Binary collation below, as in EnqueueMail: LIKE ranges are code points
    -- and control characters are never ignorable.
    DECLARE @CrLf NVARCHAR(10) = N'%[' + NCHAR(13) + NCHAR(10) + N']%';
    DECLARE @Control NVARCHAR(10) = N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%';
    SET @RejectInvalid = COALESCE(@RejectInvalid, 0);

    -- 1. Input shape.  An omitted table-valued parameter is an empty table.
    DECLARE @RowsGiven BIT = IIF(EXISTS (SELECT 1 FROM @MailRows), 1, 0);
    IF @Mails IS NULL AND @RowsGiven = 0
        THROW 50221, N'Give the mails: @Mails (a JSON array of objects) or @MailRows (mailq.MailBatchRow).', 1;
    IF @Mails IS NOT NULL AND @RowsGiven = 1
        THROW 50221, N'Give @Mails or @MailRows, not both.', 1;

    -- Temporary tables take tempdb's default collation unless told: every text
    -- column says DATABASE_DEFAULT (compared with the database's tables
    -- without a collation conflict), the key the column's binary collation.
    CREATE TABLE #Batch (
        RowNo INT NOT NULL PRIMARY KEY,
        -- as passed (the content hash covers these)
        ToAddress NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        Subject NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        Body NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        BodyFormat NVARCHAR(20) COLLATE DATABASE_DEFAULT NULL,
        TextBody NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        CC NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        BCC NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        FromAddress NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        FromName NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        ReplyTo NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        Headers NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        AccountName NVARCHAR(4000) COLLATE DATABASE_DEFAULT NULL,
        AppName NVARCHAR(4000) COLLATE DATABASE_DEFAULT NULL,
        Priority INT NULL,
        DateToProcess DATETIME2(3) NULL,
        ExpiresAtUtc DATETIME2(3) NULL,
        MaxAttempts INT NULL,
        IdempotencyKey NVARCHAR(4000) COLLATE Latin1_General_100_BIN2 NULL,
        Attachments NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        RunMode NVARCHAR(4000) COLLATE DATABASE_DEFAULT NULL,  -- revision 0015
        TemplateName NVARCHAR(4000) COLLATE DATABASE_DEFAULT NULL,   -- revision 0016
        TemplateVersion INT NULL,
        TemplateModel NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        -- derived
        HeadersJson NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,      -- Headers if a JSON object, else NULL
        AttachmentsJson NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,  -- Attachments if a JSON array, else NULL
        EffAppName NVARCHAR(128) COLLATE DATABASE_DEFAULT NULL,
        EffAccountName NVARCHAR(128) COLLATE DATABASE_DEFAULT NULL,
        EffFromAddress NVARCHAR(320) COLLATE DATABASE_DEFAULT NULL,
        EffFromName NVARCHAR(200) COLLATE DATABASE_DEFAULT NULL,
        DefaultFrom NVARCHAR(320) COLLATE DATABASE_DEFAULT NULL,
        DefaultFromName NVARCHAR(200) COLLATE DATABASE_DEFAULT NULL,
        DueUtc DATETIME2(3) NULL,
        ContentHash VARBINARY(32) NULL,
        MessageID NVARCHAR(255) COLLATE DATABASE_DEFAULT NULL,
        KeyLeader INT NULL,                    -- RowNo of the row that creates the key's mail
        ToCount INT NULL, ReplyToCount INT NULL, FromCount INT NULL, FromHasName BIT NULL, RecipientCount INT NULL,
        AppKnown BIT NULL, AccountBound BIT NULL, FromBound BIT NULL,
        TemplateLatest INT NULL, TemplateRetired BIT NULL,  -- revision 0016
        Suppressed NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL, EntriesLeft INT NULL  -- suppression (issue 28)
    );
    CREATE TABLE #Problem (
        RowNo INT NOT NULL,
        RuleOrder INT NOT NULL,
        Field NVARCHAR(128) COLLATE DATABASE_DEFAULT NOT NULL,
        ErrorNumber INT NOT NULL,
        Message NVARCHAR(2048) COLLATE DATABASE_DEFAULT NOT NULL,
        INDEX IX_Problem CLUSTERED (RowNo, RuleOrder)
    );
    CREATE TABLE #Attachment (
        RowNo INT NOT NULL,
        AttachmentNo INT NOT NULL,
        FileName NVARCHAR(4000) COLLATE DATABASE_DEFAULT NULL,
        ContentType NVARCHAR(4000) COLLATE DATABASE_DEFAULT NULL,
        ContentBase64 NVARCHAR(MAX) COLLATE DATABASE_DEFAULT NULL,
        Base64Ok BIT NOT NULL DEFAULT (0),
        Content VARBINARY(MAX) NULL,
        PRIMARY KEY (RowNo, AttachmentNo)
    );
    -- The created mails.  Kept for the event stream (see the marked place below).
    CREATE TABLE #Inserted (
        MailID BIGINT NOT NULL PRIMARY KEY,
        MessageID NVARCHAR(255) COLLATE DATABASE_DEFAULT NOT NULL UNIQUE,
        AppName NVARCHAR(128) COLLATE DATABASE_DEFAULT NULL
    );
    CREATE TABLE #Existing (
        RowNo INT NOT NULL PRIMARY KEY,
        MailID BIGINT NOT NULL,
        MessageID NVARCHAR(255) COLLATE DATABASE_DEFAULT NOT NULL,
        ContentHash VARBINARY(32) NOT NULL
    );
    -- The distinct idempotency keys, numbered in binary order (the lock order).
    CREATE TABLE #Key (
        Seq INT IDENTITY (1, 1) NOT NULL PRIMARY KEY,
        KeyText NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL
    );

    IF @Mails IS NOT NULL
    BEGIN
        -- The size cap first: every body is copied to tempdb (#Batch) and the
        -- text is parsed more than once, so an unbounded @Mails would be an
        -- unbounded tempdb and CPU cost.
        IF DATALENGTH(@Mails) > @MaxBatchBytes
        BEGIN
            SET @Msg = CONCAT(
                N'@Mails is ', DATALENGTH(@Mails), N' bytes; a batch takes at most ', @MaxBatchBytes,
                N' bytes (', @MaxBatchBytes / 1048576, N' MB): split it into smaller batches.'
            );
            THROW 50226, @Msg, 1;
        END;
        -- The first character that is not JSON white space (tab, line feed,
        -- carriage return, space, RFC 8259 section 2) must open an array.
        -- LTRIM alone strips only spaces before SQL Server 2022.
        IF ISJSON(@Mails) = 0
            OR LEFT(LTRIM(TRANSLATE(LEFT(@Mails, 4000), NCHAR(9) + NCHAR(10) + NCHAR(13), N'   ')), 1) <> N'['
            THROW 50221,
                N'@Mails must be a JSON array of objects, e.g. [{"ToAddress": "a@x.org", "Body": "B"}].',
                1;
        SELECT TOP (1) @Msg = CONCAT(N'@Mails: element ', CAST(e.[key] AS INT) + 1, N' is not a JSON object.')
        FROM OPENJSON(@Mails) AS e
        WHERE e.[type] <> 5
        ORDER BY CAST(e.[key] AS INT);
        IF @Msg IS NOT NULL THROW 50221, @Msg, 1;
        SET @RowCount = (SELECT COUNT(*) FROM OPENJSON(@Mails));
        IF @RowCount NOT BETWEEN 1 AND @MaxRows
        BEGIN
            SET @Msg = CONCAT(N'@Mails holds ', @RowCount, N' mails; a batch takes 1-', @MaxRows, N'.');
            THROW 50222, @Msg, 1;
        END;

        -- Every field read as text (lax paths: a field of another JSON type
        -- reads as NULL), then converted with TRY_CONVERT, so that one bad row
        -- cannot fail the statement for all rows; rule 50223 below names it.
        INSERT INTO #Batch (
            RowNo, ToAddress, Subject, Body, BodyFormat, TextBody, CC, BCC, FromAddress, FromName,
            ReplyTo, Headers, AccountName, AppName, Priority, DateToProcess, ExpiresAtUtc,
            MaxAttempts, IdempotencyKey, Attachments, RunMode, TemplateName, TemplateVersion, TemplateModel
        )
        SELECT
            CAST(e.[key] AS INT) + 1,
            f.ToAddress, f.Subject, f.Body, f.BodyFormat, f.TextBody, f.CC, f.BCC, f.FromAddress,
            f.FromName, f.ReplyTo, COALESCE(f.HeadersObject, f.HeadersText), f.AccountName, f.AppName,
            TRY_CONVERT(INT, f.Priority),
            -- Through DATETIMEOFFSET: a time with an offset ("...+02:00") is
            -- converted to UTC; a time with "Z" or no offset is UTC (the
            -- offset defaults to +00:00, Microsoft's "datetimeoffset").  A
            -- direct conversion to DATETIME2 would drop the offset silently.
            -- Years 2-9998 only: SWITCHOFFSET of a time a day from either end
            -- of the range could leave it and raise an error for the whole
            -- batch; outside that range the field reads as NULL here and
            -- rule 50223 below names the row.
            CONVERT(DATETIME2(3), SWITCHOFFSET(IIF(
                YEAR(TRY_CONVERT(DATETIMEOFFSET(3), f.DateToProcess, 127)) BETWEEN 2 AND 9998,
                TRY_CONVERT(DATETIMEOFFSET(3), f.DateToProcess, 127), NULL
            ), N'+00:00')),
            CONVERT(DATETIME2(3), SWITCHOFFSET(IIF(
                YEAR(TRY_CONVERT(DATETIMEOFFSET(3), f.ExpiresAtUtc, 127)) BETWEEN 2 AND 9998,
                TRY_CONVERT(DATETIMEOFFSET(3), f.ExpiresAtUtc, 127), NULL
            ), N'+00:00')),
            TRY_CONVERT(INT, f.MaxAttempts),
            f.IdempotencyKey, COALESCE(f.AttachmentsArray, f.AttachmentsText), f.RunMode,
            f.TemplateName, TRY_CONVERT(INT, f.TemplateVersion), COALESCE(f.TemplateModelObject, f.TemplateModelText)
        FROM OPENJSON(@Mails) AS e
        CROSS APPLY OPENJSON (e.[value])
            WITH (
                ToAddress NVARCHAR(MAX) '$.ToAddress', Subject NVARCHAR(MAX) '$.Subject',
                Body NVARCHAR(MAX) '$.Body', BodyFormat NVARCHAR(20) '$.BodyFormat',
                TextBody NVARCHAR(MAX) '$.TextBody', CC NVARCHAR(MAX) '$.CC', BCC NVARCHAR(MAX) '$.BCC',
                FromAddress NVARCHAR(MAX) '$.FromAddress', FromName NVARCHAR(MAX) '$.FromName',
                ReplyTo NVARCHAR(MAX) '$.ReplyTo',
                HeadersObject NVARCHAR(MAX) '$.Headers' AS JSON, HeadersText NVARCHAR(MAX) '$.Headers',
                AccountName NVARCHAR(4000) '$.AccountName', AppName NVARCHAR(4000) '$.AppName',
                Priority NVARCHAR(MAX) '$.Priority', DateToProcess NVARCHAR(MAX) '$.DateToProcess',
                ExpiresAtUtc NVARCHAR(MAX) '$.ExpiresAtUtc', MaxAttempts NVARCHAR(MAX) '$.MaxAttempts',
                IdempotencyKey NVARCHAR(4000) '$.IdempotencyKey',
                AttachmentsArray NVARCHAR(MAX) '$.Attachments' AS JSON,
                AttachmentsText NVARCHAR(MAX) '$.Attachments',
                RunMode NVARCHAR(4000) '$.RunMode',
                TemplateName NVARCHAR(4000) '$.TemplateName', TemplateVersion NVARCHAR(MAX) '$.TemplateVersion',
                TemplateModelObject NVARCHAR(MAX) '$.TemplateModel' AS JSON,
                TemplateModelText NVARCHAR(MAX) '$.TemplateModel'
            ) AS f;

        -- 50223: unknown field names, and fields of the wrong JSON type
        -- (a string field given as a number, object or array; a number that
        -- is not an integer; a time that is not ISO 8601 UTC).
        INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
        SELECT p.RowNo, 1, p.Field, 50223, p.Message
        FROM (
            SELECT
                CAST(e.[key] AS INT) + 1 AS RowNo,
                LEFT(k.[key], 128) AS Field,
                CASE
                    WHEN k.[key] COLLATE Latin1_General_100_BIN2 NOT IN (
                        N'ToAddress', N'Subject', N'Body', N'BodyFormat', N'TextBody', N'CC', N'BCC',
                        N'FromAddress', N'FromName', N'ReplyTo', N'Headers', N'AccountName', N'AppName',
                        N'Priority', N'DateToProcess', N'ExpiresAtUtc', N'MaxAttempts', N'IdempotencyKey',
                        N'Attachments', N'RunMode', N'TemplateName', N'TemplateVersion', N'TemplateModel'
                    )
                        THEN CONCAT(
                            N'''', LEFT(k.[key], 80), N''' is not a field of a mail (names are case-sensitive).'
                        )
                    WHEN k.[type] <> 0 AND k.[key] IN (N'Headers', N'Attachments', N'TemplateModel') THEN NULL
                    WHEN k.[type] = 0 THEN NULL   -- JSON null: the default
                    WHEN k.[key] IN (N'Priority', N'MaxAttempts', N'TemplateVersion')
                        AND (k.[type] <> 2 OR TRY_CONVERT(INT, k.[value]) IS NULL)
                        THEN CONCAT(N'''', k.[key], N''' must be a JSON number that is an integer (not a string).')
                    WHEN k.[key] IN (N'DateToProcess', N'ExpiresAtUtc')
                        AND (
                            k.[type] <> 1
                            OR TRY_CONVERT(DATETIMEOFFSET(3), k.[value], 127) IS NULL
                            OR YEAR(TRY_CONVERT(DATETIMEOFFSET(3), k.[value], 127)) NOT BETWEEN 2 AND 9998
                        )
                        THEN CONCAT(
                            N'''', k.[key], N''' must be an ISO 8601 time, e.g. "2030-01-01T08:00:00Z" ',
                            N'(an offset such as +02:00 is converted to UTC).'
                        )
                    WHEN k.[key] NOT IN (N'Priority', N'MaxAttempts', N'TemplateVersion')
                        AND k.[type] <> 1
                        THEN CONCAT(N'''', k.[key], N''' must be a JSON string.')
                END AS Message
            FROM OPENJSON(@Mails) AS e
            CROSS APPLY OPENJSON(e.[value]) AS k
        ) AS p
        WHERE p.Message IS NOT NULL;
    END;
    ELSE
    BEGIN
        SET @RowCount = (SELECT COUNT(*) FROM @MailRows);
        IF @RowCount > @MaxRows
        BEGIN
            SET @Msg = CONCAT(N'@MailRows holds ', @RowCount, N' mails; a batch takes 1-', @MaxRows, N'.');
            THROW 50222, @Msg, 1;
        END;
        -- The same size cap as @Mails, over the columns that can be large.
        SET @Bytes = (
            SELECT SUM(
                CAST(COALESCE(DATALENGTH(r.Body), 0) AS BIGINT) + COALESCE(DATALENGTH(r.TextBody), 0)
                + COALESCE(DATALENGTH(r.Headers), 0) + COALESCE(DATALENGTH(r.Attachments), 0)
                + COALESCE(DATALENGTH(r.ToAddress), 0) + COALESCE(DATALENGTH(r.CC), 0)
                + COALESCE(DATALENGTH(r.BCC), 0) + COALESCE(DATALENGTH(r.Subject), 0)
                + COALESCE(DATALENGTH(r.TemplateModel), 0)
            )
            FROM @MailRows AS r
        );
        IF @Bytes > @MaxBatchBytes
        BEGIN
            SET @Msg = CONCAT(
                N'@MailRows holds ', @Bytes, N' bytes of text; a batch takes at most ', @MaxBatchBytes,
                N' bytes (', @MaxBatchBytes / 1048576, N' MB): split it into smaller batches.'
            );
            THROW 50226, @Msg, 1;
        END;
        INSERT INTO #Batch (
            RowNo, ToAddress, Subject, Body, BodyFormat, TextBody, CC, BCC, FromAddress, FromName,
            ReplyTo, Headers, AccountName, AppName, Priority, DateToProcess, ExpiresAtUtc,
            MaxAttempts, IdempotencyKey, Attachments, RunMode, TemplateName, TemplateVersion, TemplateModel
        )
        SELECT
            r.RowNo, r.ToAddress, r.Subject, r.Body, r.BodyFormat, r.TextBody, r.CC, r.BCC, r.FromAddress,
            r.FromName, r.ReplyTo, r.Headers, r.AccountName, r.AppName, r.Priority, r.DateToProcess,
            r.ExpiresAtUtc, r.MaxAttempts, r.IdempotencyKey, r.Attachments, r.RunMode,
            r.TemplateName, r.TemplateVersion, r.TemplateModel
        FROM @MailRows AS r;
    END;

    -- 2. Derived values.  The content hash is EnqueueMail's: the same
    --    FOR JSON of the fields as passed, with the same names, order and types.
    DECLARE @PrincipalApp NVARCHAR(128) = (
        SELECT u.AppName FROM mailq.ApplicationPrincipal AS u WHERE u.PrincipalName = USER_NAME()
    );
    DECLARE @DefaultAccount NVARCHAR(128) = (
        SELECT a.AccountName FROM mailq.SendingAccount AS a WHERE a.IsDefault = 1
    );

    UPDATE b
    SET
        HeadersJson = IIF(ISJSON(b.Headers) = 1 AND LEFT(LTRIM(b.Headers), 1) = N'{', b.Headers, NULL),
        AttachmentsJson = IIF(ISJSON(b.Attachments) = 1 AND LEFT(LTRIM(b.Attachments), 1) = N'[', b.Attachments, NULL),
        EffAppName = IIF(@PrincipalApp IS NOT NULL, @PrincipalApp, LEFT(b.AppName, 128)),
        EffAccountName = a.AccountName,
        DefaultFrom = a.DefaultFromAddress,
        DefaultFromName = a.DefaultFromName,
        DueUtc = COALESCE(b.DateToProcess, @Now),
        -- Revision 0016: EnqueueMail's template fields join the hash only when given.
        ContentHash = HASHBYTES('SHA2_256', CONCAT(h.ContentJson, t.TemplateJson)),
        TemplateLatest = m.LatestVersion,
        TemplateRetired = IIF(m.RetiredAtUtc IS NULL, 0, 1)
    FROM #Batch AS b
    LEFT JOIN mailq.SendingAccount AS a
        ON a.AccountName = COALESCE(b.AccountName, @DefaultAccount)
    CROSS APPLY (
        -- Run mode (revision 0015): appended only when given, as EnqueueMail does.
        SELECT CONCAT((
            SELECT
                -- Unaliased columns keep their names: the same JSON as EnqueueMail's
                -- (@ToAddress AS ToAddress, ...), in the same order.
                b.ToAddress, b.CC, b.BCC, b.Subject, b.Body, b.BodyFormat, b.TextBody,
                b.FromAddress, b.FromName, b.ReplyTo, b.Headers, b.AccountName, b.AppName,
                b.Priority, b.DateToProcess, b.ExpiresAtUtc, b.MaxAttempts, b.Attachments
            FOR JSON PATH, WITHOUT_ARRAY_WRAPPER, INCLUDE_NULL_VALUES
        ), IIF(b.RunMode IS NULL, N'', CONCAT(N'|RunMode=', b.RunMode))) AS ContentJson
    ) AS h
    CROSS APPLY (
        SELECT IIF(
            b.TemplateName IS NULL AND b.TemplateVersion IS NULL AND b.TemplateModel IS NULL,
            NULL,
            (SELECT b.TemplateName, b.TemplateVersion, b.TemplateModel FOR JSON PATH, WITHOUT_ARRAY_WRAPPER)
        ) AS TemplateJson
    ) AS t
    LEFT JOIN mailq.MailTemplate AS m ON m.TemplateName = LEFT(b.TemplateName, 128);

    UPDATE #Batch
    SET
        EffFromAddress = LEFT(LTRIM(RTRIM(COALESCE(FromAddress, DefaultFrom))), 320),
        EffFromName = LEFT(COALESCE(FromName, DefaultFromName), 200);

    -- Address counts (mailq.ParseAddressList is inline: one plan for all rows).
    UPDATE b
    SET
        ToCount = (SELECT COUNT(*) FROM mailq.ParseAddressList(b.ToAddress)),
        ReplyToCount = (SELECT COUNT(*) FROM mailq.ParseAddressList(b.ReplyTo)),
        FromCount = (SELECT COUNT(*) FROM mailq.ParseAddressList(b.FromAddress)),
        FromHasName = IIF(EXISTS (
            SELECT 1 FROM mailq.ParseAddressList(b.FromAddress) AS a WHERE a.DisplayName IS NOT NULL
        ), 1, 0),
        RecipientCount = (
            SELECT COUNT(*)
            FROM (VALUES (b.ToAddress), (b.CC), (b.BCC)) AS r(Value)
            CROSS APPLY mailq.ParseAddressList(r.Value)
        )
    FROM #Batch AS b;

    -- 3. Validation, rule by rule over all rows (RuleOrder = EnqueueMail's order).
    -- Revision 0016: a template instead of Subject / Body / TextBody (EnqueueMail's
    -- 50281, 50280 right after its recipient rule 50101 (RuleOrder 7) and before
    -- 50121, 50120; 50285, 50284, 50282, 50283 (46-49) after its run-mode rule
    -- 50240 (45), before headers (50): one RuleOrder per rule, so the first
    -- failed rule of a row is the one EnqueueMail raises).  A template row's Subject and Body are N''
    -- (stored, like EnqueueMail's; the worker renders them).
    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT b.RowNo, c.RuleOrder, c.Field, c.ErrorNumber, c.Message
    FROM #Batch AS b
    CROSS APPLY (
        VALUES
        (8, N'TemplateName', 50281,
            IIF(b.TemplateName IS NULL AND (b.TemplateVersion IS NOT NULL OR b.TemplateModel IS NOT NULL), 1, 0),
            N'TemplateVersion and TemplateModel need TemplateName.'),
        (9, N'TemplateName', 50280,
            IIF(b.TemplateName IS NOT NULL
                AND (b.Body IS NOT NULL OR b.TextBody IS NOT NULL OR NULLIF(b.Subject, N'') IS NOT NULL), 1, 0),
            N'TemplateName renders the subject and the body: leave Subject, Body and TextBody out.'),
        (46, N'TemplateName', 50285,
            IIF(b.TemplateName IS NOT NULL AND (
                LEN(b.TemplateName) NOT BETWEEN 1 AND 128
                OR b.TemplateName COLLATE Latin1_General_100_BIN2 LIKE N'%[^A-Za-z0-9._-]%'
                OR b.TemplateVersion < 1), 1, 0),
            N'TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ - and TemplateVersion >= 1.'),
        (47, N'TemplateModel', 50284,
            IIF(b.TemplateName IS NOT NULL AND b.TemplateModel IS NOT NULL AND (
                LEN(b.TemplateModel) > 2000000 OR ISJSON(b.TemplateModel) = 0
                OR LEFT(LTRIM(b.TemplateModel), 1) <> N'{'), 1, 0),
            N'TemplateModel must be a JSON object (its keys are the variables), <= 2,000,000 characters.'),
        (48, N'TemplateName', 50282,
            IIF(b.TemplateName IS NOT NULL
                AND (b.TemplateLatest IS NULL OR b.TemplateVersion > b.TemplateLatest), 1, 0),
            CONCAT(N'TemplateName ''', LEFT(b.TemplateName, 130), N''' ',
                IIF(b.TemplateLatest IS NULL, N'is not a template (mailq.AddMailTemplateVersion).',
                    CONCAT(N'has no version ', b.TemplateVersion, N' (latest: ', b.TemplateLatest, N').')))),
        (49, N'TemplateName', 50283, IIF(b.TemplateRetired = 1, 1, 0),
            CONCAT(N'TemplateName ''', LEFT(b.TemplateName, 130),
                N''' is retired (mailq.RetireMailTemplate @Retire = 0 brings it back).'))
    ) AS c(RuleOrder, Field, ErrorNumber, Failed, Message)
    WHERE c.Failed = 1;

    UPDATE #Batch
    SET Subject = N'', Body = N'', BodyFormat = N'Text', TemplateModel = COALESCE(TemplateModel, N'{}')
    WHERE TemplateName IS NOT NULL AND Body IS NULL AND TextBody IS NULL AND NULLIF(Subject, N'') IS NULL;

    -- Required values, sizes, CR/LF, body format, priority, attempts, expiry, body size.
    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT b.RowNo, c.RuleOrder, c.Field, c.ErrorNumber, c.Message
    FROM #Batch AS b
    CROSS APPLY (
        VALUES
        (7, N'ToAddress', 50101,
            IIF(b.ToAddress IS NULL OR b.ToCount = 0, 1, 0),
            N'ToAddress is required: give at least one recipient address (separate several with ;).'),
        (11, N'Subject', 50121, IIF(b.Subject IS NULL, 1, 0),
            N'Subject is required (an empty string for a mail without subject).'),
        (12, N'Body', 50120, IIF(b.Body IS NULL, 1, 0), N'Body is required.'),
        (40, N'BodyFormat', 50118, IIF(COALESCE(b.BodyFormat, N'Text') NOT IN (N'Text', N'Html'), 1, 0),
            CONCAT(N'BodyFormat must be Text or Html; got ''', LEFT(b.BodyFormat, 20), N'''.')),
        (41, N'Priority', 50109, IIF(COALESCE(b.Priority, 5) NOT BETWEEN 0 AND 9, 1, 0),
            CONCAT(N'Priority must be 0-9 (9 is sent first); got ', b.Priority, N'.')),
        (42, N'MaxAttempts', 50119, IIF(COALESCE(b.MaxAttempts, 5) NOT BETWEEN 1 AND 20, 1, 0),
            CONCAT(N'MaxAttempts must be 1-20; got ', b.MaxAttempts, N'.')),
        (43, N'ExpiresAtUtc', 50110, IIF(b.ExpiresAtUtc <= b.DueUtc, 1, 0),
            CONCAT(N'ExpiresAtUtc (', CONVERT(NVARCHAR(30), b.ExpiresAtUtc, 126),
                N') must be later than the due time (', CONVERT(NVARCHAR(30), b.DueUtc, 126), N').')),
        (44, N'Body', 50111, IIF(LEN(b.Body) > 2000000 OR LEN(b.TextBody) > 2000000, 1, 0),
            N'Body and TextBody are limited to 2,000,000 characters each.'),
        -- Run mode (revision 0015): EnqueueMail's rule, right after 50111.
        (45, N'RunMode', 50240,
            IIF(
                b.RunMode IS NOT NULL AND (
                    LEN(b.RunMode) NOT BETWEEN 1 AND 32
                    OR b.RunMode COLLATE Latin1_General_100_BIN2 NOT LIKE N'[a-z]%'
                    OR b.RunMode COLLATE Latin1_General_100_BIN2 LIKE N'%[^a-z0-9_-]%'
                ),
                1, 0
            ),
            CONCAT(
                N'RunMode must be a run-mode name of 1-32 characters, a-z first, then a-z 0-9 - _ ',
                N'(e.g. prod, staging, test); got ''',
                LEFT(b.RunMode, 40), N'''.'
            )),
        (50, N'Headers', 50106,
            IIF(b.Headers IS NOT NULL AND b.HeadersJson IS NULL, 1, 0),
            N'Headers must be a JSON object of string values, e.g. {"X-Order-Id": "42"}.')
    ) AS c(RuleOrder, Field, ErrorNumber, Failed, Message)
    WHERE c.Failed = 1;

    -- Sizes (50103) and CR/LF (50105): the first offending field per row.
    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT x.RowNo, x.RuleOrder, x.Field, x.ErrorNumber, x.Message
    FROM (
        SELECT
            b.RowNo, 20 AS RuleOrder, v.Field, 50103 AS ErrorNumber,
            CONCAT(v.Field, N' is ', LEN(v.Value), N' characters long; the limit is ', v.MaxLength, N'.') AS Message,
            ROW_NUMBER() OVER (PARTITION BY b.RowNo ORDER BY v.Position) AS Nth
        FROM #Batch AS b
        CROSS APPLY (
            VALUES
            (1, N'ToAddress', b.ToAddress, 4000), (2, N'CC', b.CC, 4000), (3, N'BCC', b.BCC, 4000),
            (4, N'Subject', b.Subject, 900), (5, N'FromAddress', b.FromAddress, 320),
            (6, N'FromName', b.FromName, 200), (7, N'ReplyTo', b.ReplyTo, 320),
            (8, N'AccountName', b.AccountName, 128), (9, N'AppName', b.AppName, 128),
            (10, N'IdempotencyKey', b.IdempotencyKey, 200)
        ) AS v(Position, Field, Value, MaxLength)
        WHERE LEN(v.Value) > v.MaxLength
        UNION ALL
        SELECT
            b.RowNo, 21, v.Field, 50105,
            CONCAT(v.Field, N' contains CR or LF; header values must be one line (header injection is refused).'),
            ROW_NUMBER() OVER (PARTITION BY b.RowNo ORDER BY v.Position)
        FROM #Batch AS b
        CROSS APPLY (
            VALUES
            (1, N'Subject', b.Subject), (2, N'FromName', b.FromName), (3, N'ReplyTo', b.ReplyTo),
            (4, N'FromAddress', b.FromAddress), (5, N'IdempotencyKey', b.IdempotencyKey)
        ) AS v(Position, Field, Value)
        WHERE v.Value COLLATE Latin1_General_100_BIN2 LIKE @CrLf
    ) AS x
    WHERE x.Nth = 1;

    -- Addresses (50102) and recipient count (50104).
    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT x.RowNo, x.RuleOrder, x.Field, 50102, x.Message
    FROM (
        SELECT
            b.RowNo, 30 AS RuleOrder, v.Field,
            CONCAT(v.Field, N': address ''', LEFT(a.Address, 100), N''' ', a.Problem, N'.') AS Message,
            ROW_NUMBER() OVER (PARTITION BY b.RowNo ORDER BY v.Position) AS Nth
        FROM #Batch AS b
        CROSS APPLY (
            VALUES
            (1, N'ToAddress', b.ToAddress), (2, N'CC', b.CC), (3, N'BCC', b.BCC),
            (4, N'ReplyTo', b.ReplyTo), (5, N'FromAddress', b.FromAddress)
        ) AS v(Position, Field, Value)
        CROSS APPLY mailq.ParseAddressList(v.Value) AS a
        WHERE a.Problem IS NOT NULL
    ) AS x
    WHERE x.Nth = 1;

    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT b.RowNo, c.RuleOrder, c.Field, c.ErrorNumber, c.Message
    FROM #Batch AS b
    CROSS APPLY (
        VALUES
        (31, N'ReplyTo', 50102, IIF(b.ReplyToCount > 1, 1, 0), N'ReplyTo takes one address.'),
        (32, N'FromAddress', 50102, IIF(b.FromCount > 1, 1, 0), N'FromAddress takes one address.'),
        (33, N'FromAddress', 50102, IIF(b.FromHasName = 1, 1, 0),
            N'FromAddress takes a bare address; give the display name in FromName.'),
        (34, N'ToAddress', 50104, IIF(b.RecipientCount > 100, 1, 0),
            CONCAT(N'ToAddress, CC and BCC name ', b.RecipientCount, N' recipients; the limit is 100.'))
    ) AS c(RuleOrder, Field, ErrorNumber, Failed, Message)
    WHERE c.Failed = 1;

    -- Business headers (HeadersJson is NULL unless Headers is a JSON object,
    -- so OPENJSON never meets text that is not JSON: no error 13609).
    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT x.RowNo, x.RuleOrder, N'Headers', x.ErrorNumber, x.Message
    FROM (
        SELECT
            y.RowNo, y.RuleOrder, y.ErrorNumber, y.Message,
            ROW_NUMBER() OVER (PARTITION BY y.RowNo, y.RuleOrder ORDER BY y.Position) AS Nth
        FROM (
            SELECT
                b.RowNo, c.RuleOrder, c.ErrorNumber, c.Message, CAST(j.[key] AS NVARCHAR(4000)) AS Position
            FROM #Batch AS b
            CROSS APPLY OPENJSON(b.HeadersJson) AS j
            CROSS APPLY (
                VALUES
                (51, 50106, IIF(j.[type] <> 1, 1, 0),
                    CONCAT(N'Headers: the value of ''', LEFT(j.[key], 80), N''' must be a JSON string.')),
                (55, 50107, IIF(
                        LEN(j.[key]) NOT BETWEEN 1 AND 76
                        OR j.[key] COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-9;-~]%', 1, 0),
                    CONCAT(N'Headers: ''', LEFT(j.[key], 80), N''' is not a valid header name ',
                        N'(1-76 printable ASCII characters, no space or colon).')),
                (56, 50108, IIF(UPPER(j.[key]) IN (
                        N'FROM', N'TO', N'CC', N'BCC', N'SUBJECT', N'MESSAGE-ID', N'DATE', N'REPLY-TO',
                        N'SENDER', N'RETURN-PATH', N'MIME-VERSION', N'CONTENT-TYPE',
                        N'CONTENT-TRANSFER-ENCODING', N'CONTENT-DISPOSITION'), 1, 0),
                    CONCAT(N'Headers: ''', LEFT(j.[key], 80), N''' is set by mailq-db and cannot be overridden.')),
                (57, 50105, IIF(j.[value] COLLATE Latin1_General_100_BIN2 LIKE @CrLf, 1, 0),
                    CONCAT(N'Headers: the value of ''', LEFT(j.[key], 80),
                        N''' contains CR or LF (header injection is refused).')),
                (58, 50103, IIF(LEN(j.[value]) > 900, 1, 0),
                    CONCAT(N'Headers: the value of ''', LEFT(j.[key], 80), N''' is longer than 900 characters.'))
            ) AS c(RuleOrder, ErrorNumber, Failed, Message)
            WHERE c.Failed = 1
            UNION ALL
            SELECT b.RowNo, 52, 50106, N'Headers holds more than 50 headers.', N''
            FROM #Batch AS b
            WHERE (SELECT COUNT(*) FROM OPENJSON(b.HeadersJson)) > 50
            UNION ALL
            SELECT b.RowNo, 53, 50106, N'Headers names one header twice.', N''
            FROM #Batch AS b
            WHERE EXISTS (
                SELECT UPPER(j.[key]) FROM OPENJSON(b.HeadersJson) AS j GROUP BY UPPER(j.[key]) HAVING COUNT(*) > 1
            )
        ) AS y
    ) AS x
    WHERE x.Nth = 1;

    -- Application mapping (50168), account (50114), application (50115),
    -- bindings (50160, 50161).
    UPDATE b
    SET
        AppKnown = IIF(EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = b.EffAppName), 1, 0),
        AccountBound = IIF(EXISTS (
            SELECT 1 FROM mailq.ApplicationAccount AS ba
            WHERE ba.AppName = b.EffAppName AND ba.AccountName = b.EffAccountName
        ), 1, 0),
        -- Addresses and domains compare case-insensitively (LOWER, then binary), as in EnqueueMail.
        FromBound = IIF(EXISTS (
            SELECT 1
            FROM mailq.ApplicationFrom AS f
            WHERE
                f.AppName = b.EffAppName
                AND (
                    f.FromPattern = LOWER(b.EffFromAddress) COLLATE Latin1_General_100_BIN2
                    OR (
                        LEFT(f.FromPattern, 1) = N'@'
                        AND RIGHT(LOWER(b.EffFromAddress) COLLATE Latin1_General_100_BIN2, LEN(f.FromPattern))
                        = f.FromPattern
                    )
                )
        ), 1, 0)
    FROM #Batch AS b
    WHERE b.EffAppName IS NOT NULL;

    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT b.RowNo, c.RuleOrder, c.Field, c.ErrorNumber, c.Message
    FROM #Batch AS b
    CROSS APPLY (
        VALUES
        (60, N'AppName', 50168,
            IIF(@PrincipalApp IS NOT NULL AND b.AppName IS NOT NULL AND b.AppName <> @PrincipalApp, 1, 0),
            CONCAT(N'Database user ', QUOTENAME(USER_NAME()), N' enqueues as application ''', @PrincipalApp,
                N''' only; got AppName ''', LEFT(b.AppName, 128), N'''.')),
        (61, N'AccountName', 50114, IIF(b.EffAccountName IS NULL, 1, 0),
            IIF(b.AccountName IS NULL,
                N'AccountName is NULL and no default sending account exists '
                + N'(mailq.UpsertSendingAccount @IsDefault = 1).',
                CONCAT(N'AccountName ''', LEFT(b.AccountName, 128),
                    N''' is not a sending account (mailq.UpsertSendingAccount).'))),
        (62, N'AppName', 50115, IIF(b.EffAppName IS NOT NULL AND b.AppKnown = 0, 1, 0),
            CONCAT(N'AppName ''', b.EffAppName, N''' is not a registered application (mailq.UpsertApplication).')),
        (63, N'AccountName', 50160, IIF(b.EffAppName IS NOT NULL AND b.AccountBound = 0, 1, 0),
            CONCAT(N'Application ''', b.EffAppName, N''' may not send through account ''', b.EffAccountName,
                N''' (an administrator binds it: mailq.BindApplication @AppName, @AccountName).')),
        (64, N'FromAddress', 50161, IIF(b.EffAppName IS NOT NULL AND b.FromBound = 0, 1, 0),
            CONCAT(N'Application ''', b.EffAppName, N''' may not send as ''', b.EffFromAddress,
                N''' (an administrator binds it: mailq.BindApplication @AppName, ',
                N'@FromAddress = N''addr'' or N''@domain'').'))
    ) AS c(RuleOrder, Field, ErrorNumber, Failed, Message)
    WHERE c.Failed = 1;

    -- Attachments.  AttachmentsJson is NULL unless Attachments is a JSON array.
    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT b.RowNo, 70, N'Attachments', 50117,
        N'Attachments must be a JSON array of {"FileName", "ContentType", "ContentBase64"} objects.'
    FROM #Batch AS b
    WHERE b.Attachments IS NOT NULL AND b.AttachmentsJson IS NULL;

    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT DISTINCT b.RowNo, 71, N'Attachments', 50117,
        N'Attachments: every element must be an object with FileName and ContentBase64.'
    FROM #Batch AS b
    CROSS APPLY OPENJSON(b.AttachmentsJson) AS e
    WHERE e.[type] <> 5;

    -- Revision 0016: a lazy attachment ("Generator") is accepted by
    -- mailq.EnqueueMail only; here it is refused with EnqueueMail's number for
    -- a malformed lazy attachment, before the ContentBase64 rule would blame it.
    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT DISTINCT b.RowNo, 70, N'Attachments', 50286,
        N'Attachments: a lazy attachment ("Generator") is accepted by mailq.EnqueueMail, not by the batch.'
    FROM #Batch AS b
    CROSS APPLY OPENJSON(b.AttachmentsJson) AS e
    WHERE e.[type] = 5 AND JSON_VALUE(e.[value], N'$.Generator') IS NOT NULL;

    INSERT INTO #Attachment (RowNo, AttachmentNo, FileName, ContentType, ContentBase64)
    SELECT b.RowNo, CAST(e.[key] AS INT) + 1, f.FileName, f.ContentType, f.ContentBase64
    FROM #Batch AS b
    CROSS APPLY OPENJSON(b.AttachmentsJson) AS e
    CROSS APPLY OPENJSON (IIF(e.[type] = 5, e.[value], NULL))
        WITH (
            FileName NVARCHAR(4000) '$.FileName',
            ContentType NVARCHAR(4000) '$.ContentType',
            ContentBase64 NVARCHAR(MAX) '$.ContentBase64'
        ) AS f;

    -- Canonical base64 only: checked as text first, so that the decoding below
    -- meets no text it would fail on (one failure would fail the whole set).
    UPDATE #Attachment
    SET Base64Ok = 1
    WHERE
        ContentBase64 IS NOT NULL
        AND ContentBase64 COLLATE Latin1_General_100_BIN2 NOT LIKE N'%[^A-Za-z0-9+/=]%'
        AND LEN(ContentBase64) % 4 = 0
        AND DATALENGTH(ContentBase64) = 2 * LEN(ContentBase64)   -- no trailing spaces
        AND (
            CHARINDEX(N'=', ContentBase64) = 0
            OR (
                CHARINDEX(N'=', ContentBase64) >= LEN(ContentBase64) - 1
                AND RIGHT(ContentBase64, LEN(ContentBase64) - CHARINDEX(N'=', ContentBase64) + 1)
                    COLLATE Latin1_General_100_BIN2 NOT LIKE N'%[^=]%'
            )
        );

    BEGIN TRY
        -- The decoder EnqueueMail uses: OPENJSON ... WITH (VARBINARY(MAX))
        -- reads a JSON string as base64.  Base64 text needs no JSON escaping.
        UPDATE t
        SET Content = d.Content
        FROM #Attachment AS t
        -- IIF, not only the WHERE, keeps other rows' text out of the decoder:
        -- a WHERE may be applied after the APPLY, a CASE argument may not.
        CROSS APPLY OPENJSON (IIF(t.Base64Ok = 1, CONCAT(N'{"c":"', t.ContentBase64, N'"}'), NULL))
            WITH (Content VARBINARY(MAX) '$.c') AS d
        WHERE t.Base64Ok = 1;
    END TRY
    BEGIN CATCH
        SET @Msg = CONCAT(N'Attachments: a ContentBase64 could not be decoded (', ERROR_MESSAGE(), N').');
        THROW 50224, @Msg, 1;
    END CATCH;

    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT x.RowNo, x.RuleOrder, N'Attachments', x.ErrorNumber, x.Message
    FROM (
        SELECT
            y.RowNo, y.RuleOrder, y.ErrorNumber, y.Message,
            ROW_NUMBER() OVER (PARTITION BY y.RowNo ORDER BY y.RuleOrder, y.AttachmentNo) AS Nth
        FROM (
            SELECT t.RowNo, 72 AS RuleOrder, t.AttachmentNo, 50117 AS ErrorNumber,
                IIF(t.ContentBase64 IS NULL,
                    N'Attachments: every element must be an object with FileName and ContentBase64.',
                    CONCAT(N'Attachments: ContentBase64 of attachment ', t.AttachmentNo,
                        N' must be base64 text (A-Z, a-z, 0-9, +, /, ''='' padding, no line breaks).')) AS Message
            FROM #Attachment AS t
            WHERE t.Base64Ok = 0
            UNION ALL
            SELECT t.RowNo, 73, 0, 50112, N'Attachments holds more than 10 attachments.'
            FROM #Attachment AS t
            GROUP BY t.RowNo
            HAVING COUNT(*) > 10
            UNION ALL
            SELECT t.RowNo, 74, t.AttachmentNo, 50113,
                CONCAT(N'Attachments: file name ''', LEFT(t.FileName, 100),
                    N''' must be a bare file name (not empty, no path, no control characters, <= 255 characters).')
            FROM #Attachment AS t
            WHERE
                NULLIF(LTRIM(RTRIM(t.FileName)), N'') IS NULL
                OR t.FileName LIKE N'%[/\:]%'
                OR t.FileName IN (N'.', N'..')
                OR t.FileName COLLATE Latin1_General_100_BIN2 LIKE @Control
                OR LEN(t.FileName) > 255
            UNION ALL
            SELECT t.RowNo, 75, t.AttachmentNo, 50117,
                CONCAT(N'Attachments: content type of ''', LEFT(t.FileName, 100), N''' must look like type/subtype.')
            FROM #Attachment AS t
            WHERE
                t.ContentType IS NOT NULL
                AND (
                    t.ContentType NOT LIKE N'_%/_%'
                    OR t.ContentType COLLATE Latin1_General_100_BIN2 LIKE @CrLf
                    OR LEN(t.ContentType) > 255
                )
            UNION ALL
            SELECT t.RowNo, 76, t.AttachmentNo, 50112,
                CONCAT(N'Attachments: ''', LEFT(t.FileName, 100), N''' is ', DATALENGTH(t.Content),
                    N' bytes; the limit is 10485760 (10 MiB) per attachment.')
            FROM #Attachment AS t
            WHERE DATALENGTH(t.Content) > 10485760
            UNION ALL
            SELECT t.RowNo, 77, 0, 50112, N'Attachments total more than 26214400 bytes (25 MiB) per mail.'
            FROM #Attachment AS t
            GROUP BY t.RowNo
            HAVING SUM(CAST(DATALENGTH(t.Content) AS BIGINT)) > 26214400
        ) AS y
    ) AS x
    WHERE x.Nth = 1;

    -- Idempotency keys within the batch: the first otherwise valid row with a
    -- key leads; a later row with the key and other content fails (50116).
    -- Keys compare as the column does (binary, trailing spaces ignored).
    UPDATE b
    SET KeyLeader = l.Leader
    FROM #Batch AS b
    INNER JOIN (
        SELECT v.IdempotencyKey COLLATE Latin1_General_100_BIN2 AS KeyText, MIN(v.RowNo) AS Leader
        FROM #Batch AS v
        WHERE v.IdempotencyKey IS NOT NULL AND NOT EXISTS (SELECT 1 FROM #Problem AS p WHERE p.RowNo = v.RowNo)
        GROUP BY v.IdempotencyKey COLLATE Latin1_General_100_BIN2
    ) AS l
        ON b.IdempotencyKey COLLATE Latin1_General_100_BIN2 = l.KeyText
    WHERE NOT EXISTS (SELECT 1 FROM #Problem AS p WHERE p.RowNo = b.RowNo);

    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT b.RowNo, 80, N'IdempotencyKey', 50116,
        CONCAT(N'IdempotencyKey ''', b.IdempotencyKey, N''' is used by row ', b.KeyLeader,
            N' of this batch with different content; use a new key for a different mail.')
    FROM #Batch AS b
    INNER JOIN #Batch AS l ON b.KeyLeader = l.RowNo
    WHERE b.KeyLeader <> b.RowNo AND b.ContentHash <> l.ContentHash;

    -- A Message-ID must be ASCII: a non-ASCII sender domain gets a neutral one.
    UPDATE b
    SET MessageID = CONCAT(N'<', LOWER(CONVERT(NCHAR(36), NEWID())), N'@',
        IIF(d.Domain COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-~]%', N'mailq-db.invalid', d.Domain), N'>')
    FROM #Batch AS b
    CROSS APPLY (
        SELECT SUBSTRING(b.EffFromAddress, CHARINDEX(N'@', b.EffFromAddress) + 1, 320) AS Domain
    ) AS d;

    -- 4. All-or-nothing: any invalid row stops the batch before a transaction.
    DECLARE @BadRows INT = (SELECT COUNT(DISTINCT q.RowNo) FROM #Problem AS q);
    IF @RejectInvalid = 0 AND @BadRows > 0
    BEGIN
        SELECT TOP (1)
            @Msg = LEFT(CONCAT(
                N'Row ', p.RowNo, N', field ', p.Field, N', rule ', p.ErrorNumber, N': ', p.Message,
                IIF(@BadRows > 1, CONCAT(N' (', @BadRows - 1, N' other rows are invalid too; ',
                    N'@RejectInvalid = 1 lists them all.)'), N''),
                N' Nothing was queued.'
            ), 2048)
        FROM #Problem AS p
        ORDER BY p.RowNo, p.RuleOrder;
        THROW 50220, @Msg, 1;
    END;

    -- 5. Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    DECLARE @LockResult INT, @KeyResource NVARCHAR(255), @KeyText NVARCHAR(200), @KeySeq INT = 0, @KeyCount INT;
    -- One row per key (its leader), trailing spaces removed as sp_getapplock's
    -- resource in EnqueueMail does; INSERT ... SELECT ... ORDER BY assigns the
    -- IDENTITY values in ORDER BY order (INSERT reference, "Limitations").
    INSERT INTO #Key (KeyText)
    SELECT RTRIM(b.IdempotencyKey) COLLATE Latin1_General_100_BIN2 AS KeyText
    FROM #Batch AS b
    WHERE b.KeyLeader = b.RowNo
    ORDER BY KeyText;
    SET @KeyCount = @@ROWCOUNT;
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        -- EnqueueMail's lock on each distinct key, in binary key order (see
        -- "Concurrency" above: the one loop, over keys, not rows).  Exclusive
        -- and owned by the transaction, released at its commit or rollback.
        WHILE @KeySeq < @KeyCount
        BEGIN
            SET @KeySeq += 1;
            SET @KeyText = (SELECT k.KeyText FROM #Key AS k WHERE k.Seq = @KeySeq);
            SET @KeyResource = CONCAT(N'mailq.IdempotencyKey:', @KeyText);
            EXEC @LockResult = sys.sp_getapplock
                @Resource = @KeyResource,
                @LockMode = N'Exclusive',
                @LockOwner = N'Transaction',
                @LockTimeout = 10000;
            -- < 0: timed out (-1), cancelled (-2), deadlock victim (-3), call
            -- error (-999); a deadlock on an application lock does not roll
            -- back the transaction (sp_getapplock, Remarks): this THROW does.
            IF @LockResult < 0
            BEGIN
                SET @Msg = CONCAT(
                    N'IdempotencyKey ''', @KeyText, N''': another transaction enqueueing the same key ',
                    N'held it for 10 s (sp_getapplock returned ', @LockResult, N'); retry once it committed.'
                );
                THROW 50225, @Msg, 1;
            END;
        END;

        -- Keys already queued.  A plain read is exact under the locks just
        -- taken (only EnqueueMail and this procedure write keys, both under
        -- them).  "IS NOT NULL" repeats the filter of UX_MailQueue_IdempotencyKey.
        -- FORCESEEK: one seek per key on that index (a loop join), never a
        -- scan of it, which under locking READ COMMITTED could wait on other
        -- sessions' uncommitted keys that this batch does not ask about.
        INSERT INTO #Existing (RowNo, MailID, MessageID, ContentHash)
        SELECT b.RowNo, q.ID, q.MessageID, q.ContentHash
        FROM #Batch AS b
        INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK)
            ON b.IdempotencyKey = q.IdempotencyKey AND q.IdempotencyKey IS NOT NULL
        WHERE b.KeyLeader = b.RowNo;

        INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
        SELECT b.RowNo, 81, N'IdempotencyKey', 50116,
            CONCAT(N'IdempotencyKey ''', b.IdempotencyKey, N''' already belongs to mail ', x.MailID,
                N' with different content; use a new key for a different mail.')
        FROM #Batch AS b
        INNER JOIN #Existing AS x ON b.KeyLeader = x.RowNo
        WHERE x.ContentHash <> b.ContentHash;

        IF @RejectInvalid = 0 AND EXISTS (SELECT 1 FROM #Problem)
        BEGIN
            SELECT TOP (1)
                @Msg = LEFT(CONCAT(N'Row ', p.RowNo, N', field ', p.Field, N', rule ', p.ErrorNumber, N': ',
                    p.Message, N' Nothing was queued.'), 2048)
            FROM #Problem AS p
            ORDER BY p.RowNo, p.RuleOrder;
            THROW 50220, @Msg, 1;
        END;

        -- >>> suppression (issue 28, docs/bounces.md): as mailq.EnqueueMail,
        -- per row that creates a mail: suppressed recipients are left out (event
        -- RecipientSuppressed below); a row left with nobody fails with rule
        -- 50600, and so do the rows that share its idempotency key.
        UPDATE b
        SET
            b.ToAddress = ISNULL(f.ToAddress, N''),
            b.CC = f.CC,
            b.BCC = f.BCC,
            b.Suppressed = f.Suppressed,
            b.EntriesLeft = f.EntriesLeft
        FROM #Batch AS b
        CROSS APPLY mailq.FilterSuppressedRecipients(b.EffAccountName, b.EffAppName, b.ToAddress, b.CC, b.BCC) AS f
        WHERE
            f.SuppressedCount > 0
            AND NOT EXISTS (SELECT 1 FROM #Problem AS p WHERE p.RowNo = b.RowNo)
            AND (b.KeyLeader IS NULL OR (b.KeyLeader = b.RowNo AND NOT EXISTS (
                SELECT 1 FROM #Existing AS x WHERE x.RowNo = b.RowNo
            )));

        INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
        SELECT b.RowNo, 90, N'ToAddress', 50600,
            LEFT(CONCAT(N'Every recipient is suppressed for account ''', l.EffAccountName,
                N''' (bounced, complained or unsubscribed; mailq.ListSuppressions): ', l.Suppressed), 2048)
        FROM #Batch AS b
        INNER JOIN #Batch AS l ON ISNULL(b.KeyLeader, b.RowNo) = l.RowNo
        WHERE
            l.Suppressed IS NOT NULL AND l.EntriesLeft = 0
            AND NOT EXISTS (SELECT 1 FROM #Problem AS p WHERE p.RowNo = b.RowNo);

        IF @RejectInvalid = 0 AND EXISTS (SELECT 1 FROM #Problem)
        BEGIN
            SELECT TOP (1)
                @Msg = LEFT(CONCAT(N'Row ', p.RowNo, N', field ', p.Field, N', rule ', p.ErrorNumber, N': ',
                    p.Message, N' Nothing was queued.'), 2048)
            FROM #Problem AS p
            ORDER BY p.RowNo, p.RuleOrder;
            THROW 50220, @Msg, 1;
        END;
        -- <<< suppression

        -- The one INSERT of the mails: every valid row that creates a mail
        -- (no key, or the key's leader with no mail yet).  MessageID is unique
        -- per row (NEWID), so OUTPUT ... INTO maps IDs back to rows by it.
        INSERT INTO mailq.MailQueue (
            dtStamp, DateToProcess, VisibleAtUtc, FromName, FromAddress, ReplyTo,
            ToAddress, CC, BCC, Subject, Body, BodyFormat, TextBody, Headers,
            Status, AttemptsRemaining, Priority, AccountName, AppName,
            IdempotencyKey, ContentHash, MessageID, ExpiresAtUtc,
            RunMode,
            TemplateName, TemplateVersion, TemplateModel  -- revision 0016
        )
        OUTPUT inserted.ID, inserted.MessageID, inserted.AppName
        INTO #Inserted (MailID, MessageID, AppName)
        SELECT
            @Now, b.DueUtc AS DateToProcess, b.DueUtc AS VisibleAtUtc, b.EffFromName, b.EffFromAddress,
            LTRIM(RTRIM(b.ReplyTo)),
            b.ToAddress, b.CC, b.BCC, b.Subject, b.Body, COALESCE(b.BodyFormat, N'Text'), b.TextBody, b.Headers,
            N'UnSent', COALESCE(b.MaxAttempts, 5), COALESCE(b.Priority, 5), b.EffAccountName, b.EffAppName,
            b.IdempotencyKey, b.ContentHash, b.MessageID, b.ExpiresAtUtc,
            COALESCE(b.RunMode, N'prod'),
            b.TemplateName, b.TemplateVersion, b.TemplateModel
        FROM #Batch AS b
        WHERE
            NOT EXISTS (SELECT 1 FROM #Problem AS p WHERE p.RowNo = b.RowNo)
            AND (b.KeyLeader IS NULL OR (b.KeyLeader = b.RowNo AND NOT EXISTS (
                SELECT 1 FROM #Existing AS x WHERE x.RowNo = b.RowNo
            )))
        ORDER BY b.RowNo;   -- IDs follow the row order (INSERT reference: ORDER BY orders IDENTITY values)

        INSERT INTO mailq.MailAttachment (MailID, AttachmentNo, FileName, ContentType, Content)
        SELECT
            i.MailID,
            t.AttachmentNo,
            LTRIM(RTRIM(t.FileName)),
            COALESCE(t.ContentType, N'application/octet-stream'),
            t.Content
        FROM #Attachment AS t
        INNER JOIN #Batch AS b ON t.RowNo = b.RowNo
        INNER JOIN #Inserted AS i ON b.MessageID = i.MessageID;

        -- The event stream (docs/events.md): one 'Enqueued' event per created
        -- mail, in this transaction, so an event exists exactly when its mail
        -- does.  The INSERT above already sends its OUTPUT to #Inserted (a
        -- statement has one OUTPUT ... INTO), so the events come from #Inserted
        -- here, as ClaimMail and FinalizeMail write theirs.  Mails returned for
        -- an existing idempotency key (Created = 0) are not in #Inserted and get
        -- no event, as in EnqueueMail.  New event rows only; mailq.MailEvent
        -- has lock escalation disabled (revision 0018), so 10,000 rows keep
        -- row locks and never a table lock that would stall every other
        -- procedure's event.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT i.MailID, i.AppName, N'Enqueued', N'UnSent', 0, NULL, NULL, @Now
        FROM #Inserted AS i
        ORDER BY i.MailID;

        -- >>> suppression: the recipients left out, in the event stream
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT
            i.MailID, i.AppName, N'RecipientSuppressed', N'UnSent', 0, NULL,
            LEFT(CONCAT(N'not sent to (suppressed): ', b.Suppressed), 4000), @Now
        FROM #Inserted AS i
        INNER JOIN #Batch AS b ON i.MessageID = b.MessageID
        WHERE b.Suppressed IS NOT NULL
        ORDER BY i.MailID;
        -- <<< suppression

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    -- 6. Results: the queued (or returned) mails, then the rejected rows.
    SELECT
        b.RowNo,
        COALESCE(i.MailID, x.MailID, li.MailID, lx.MailID) AS MailID,
        COALESCE(i.MessageID, x.MessageID, li.MessageID, lx.MessageID) AS MessageID,
        CAST(IIF(i.MailID IS NOT NULL, 1, 0) AS BIT) AS Created
    FROM #Batch AS b
    LEFT JOIN #Inserted AS i ON b.MessageID = i.MessageID
    LEFT JOIN #Existing AS x ON b.RowNo = x.RowNo
    LEFT JOIN #Batch AS l ON b.KeyLeader = l.RowNo AND b.KeyLeader <> b.RowNo
    LEFT JOIN #Inserted AS li ON l.MessageID = li.MessageID
    LEFT JOIN #Existing AS lx ON l.RowNo = lx.RowNo
    WHERE NOT EXISTS (SELECT 1 FROM #Problem AS p WHERE p.RowNo = b.RowNo)
    ORDER BY b.RowNo;

    SELECT x.RowNo, x.Field, x.ErrorNumber, x.Message
    FROM (
        SELECT
            p.RowNo, p.Field, p.ErrorNumber, p.Message,
            ROW_NUMBER() OVER (PARTITION BY p.RowNo ORDER BY p.RuleOrder) AS Nth
        FROM #Problem AS p
    ) AS x
    WHERE x.Nth = 1
    ORDER BY x.RowNo;
END;
