-- mailq-db deployment script: run it with sqlcmd (-b -I recommended) or in
-- SSMS with Query > SQLCMD Mode on.  It stops at the first error.  In SSMS
-- the session stays open after a stop: run IF @@TRANCOUNT > 0 ROLLBACK; and
-- close the window (never COMMIT: a syntax error leaves the failed revision's
-- transaction open; closing also releases the deployment lock).
:on error exit
:setvar __IsSqlCmdEnabled "True"
GO
IF N'$(__IsSqlCmdEnabled)' NOT LIKE N'True'
BEGIN
    PRINT N'mailq-db: SQLCMD mode must be enabled to run this script (sqlcmd, or SSMS: Query > SQLCMD Mode).';
    SET NOEXEC ON;
END
GO


SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;
SET LOCK_TIMEOUT 30000;

GO

DECLARE @Msg NVARCHAR(2048);
IF DB_NAME() IN (N'master', N'msdb', N'tempdb', N'model')
BEGIN
    SET @Msg = CONCAT(N'mailq-db deploys into an application database, never into the system database ',
        QUOTENAME(DB_NAME()), N'. Connect to the target database (sqlcmd -d <database>, or the database in the URL).');
    THROW 50412, @Msg, 1;
END;
IF IS_ROLEMEMBER(N'db_owner') = 0 AND IS_SRVROLEMEMBER(N'sysadmin') = 0
BEGIN
    SET @Msg = CONCAT(N'The deployment creates schemas, roles, tables and Service Broker objects: the login ',
        QUOTENAME(SUSER_SNAME()), N' (user ', QUOTENAME(USER_NAME()), N') must be a member of db_owner in ',
        QUOTENAME(DB_NAME()), N' for the deployment, nothing afterwards.');
    THROW 50413, @Msg, 1;
END;
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NULL
BEGIN
    DECLARE @Elsewhere NVARCHAR(300) = (
        SELECT TOP (1) QUOTENAME(SCHEMA_NAME(t.schema_id)) + N'.' + QUOTENAME(t.name)
        FROM sys.tables AS t WHERE t.name = N'mailq_alembic_version' AND t.schema_id <> SCHEMA_ID(N'dbo'));
    IF @Elsewhere IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(N'The mailq-db version table is ', @Elsewhere, N' (an older mailq-db created it in the ',
            N'deploying user''s default schema); it now lives in dbo. Move it with: ALTER SCHEMA dbo TRANSFER ',
            @Elsewhere, N'; then deploy again.');
        THROW 50417, @Msg, 1;
    END;
END;

GO

DECLARE @Lock INT;
EXEC @Lock = sys.sp_getapplock @Resource = N'mailq-db deploy', @LockMode = N'Exclusive',
    @LockOwner = N'Session', @LockTimeout = 30000;
IF @Lock < 0
BEGIN
    DECLARE @Msg NVARCHAR(2048) = CONCAT(N'Another mailq-db deployment holds the deployment lock on ',
        QUOTENAME(DB_NAME()), N' (sp_getapplock returned ', @Lock, N'); run again when it has finished.');
    THROW 50416, @Msg, 1;
END;

GO

IF OBJECT_ID(N'dbo.mailq_deployment_option', N'U') IS NULL
    CREATE TABLE dbo.mailq_deployment_option (
        Name NVARCHAR(128) NOT NULL CONSTRAINT PK_mailq_deployment_option PRIMARY KEY,
        Value NVARCHAR(400) NOT NULL,
        ChangedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_mailq_deployment_option_ChangedAtUtc DEFAULT SYSUTCDATETIME()
    );
IF OBJECT_ID(N'dbo.mailq_deployment_file', N'U') IS NULL
    CREATE TABLE dbo.mailq_deployment_file (
        Revision VARCHAR(32) NOT NULL,
        FilePath NVARCHAR(400) NOT NULL,
        Sha256 CHAR(64) NOT NULL,
        AppliedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_mailq_deployment_file_AppliedAtUtc DEFAULT SYSUTCDATETIME(),
        CONSTRAINT PK_mailq_deployment_file PRIMARY KEY (Revision, FilePath)
    );

GO

IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
BEGIN
    IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
        AND EXISTS (SELECT 1 FROM dbo.mailq_alembic_version WHERE version_num >= '0002')
        INSERT INTO dbo.mailq_deployment_option (Name, Value)
        VALUES (N'broker', IIF(OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') IS NULL, N'off', N'on'));
END;

GO

BEGIN TRANSACTION;

-- Running downgrade 0018 -> 0014

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0018 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0018')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0018; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0018 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0018 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.EnqueueMailBatch: validates and queues many mails in one call, row by
row with mailq.EnqueueMail's rules, written by one set-based INSERT.
Parameters:  @Mails     NVARCHAR(MAX): a JSON array of objects, one per mail,
                        whose fields are EnqueueMail's parameter names without
                        '@' (ToAddress, Subject, Body, BodyFormat, TextBody,
                        CC, BCC, FromAddress, FromName, ReplyTo, Headers,
                        AccountName, AppName, Priority, DateToProcess,
                        ExpiresAtUtc, MaxAttempts, IdempotencyKey,
                        Attachments); Headers and Attachments as JSON (an
                        object / array) or as the string EnqueueMail takes;
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
                raises for that rule, 50101-50168, or 50223), Message
                NVARCHAR(2048).  One row per rejected mail: its first failed
                rule in EnqueueMail's order, the rule EnqueueMail would raise.
Rules:       each row is checked with EnqueueMail's rules in EnqueueMail's
             order (recipients, subject, body, sizes, CR/LF, addresses,
             recipient count, body format, priority, attempts, expiry, body
             size, headers JSON, caller's mapped application, account,
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
             in every index of mailq.MailQueue; from 5,000 locks on one index
             in one statement SQL Server escalates to a table lock (Microsoft,
             "Lock escalation": 5,000 locks on a single table or index
             reference, retried every 1,250 locks while blocked), held until
             the transaction ends: a batch of 5,000 mails or more can make
             claims and single enqueues wait until it commits (READPAST does
             not skip a table lock).  Keep batches below ~4,000 mails on a
             busy queue, or keep the batch's transaction short (its own, not a
             long outbox transaction); see docs/batch-enqueue.md.
Errors:      50220 a row is invalid (all-or-nothing): the message names the row,
             the field and the rule (EnqueueMail's number) and how many other
             rows are invalid; nothing is written;
             50221 neither or both of @Mails and @MailRows, or @Mails not a
             JSON array of objects; 50222 no rows or more than 10,000;
             50224 an attachment's base64 passed the textual check but could
             not be decoded (row not identifiable; nothing written);
             50225 an idempotency key's lock was not granted in 10 s (or
             deadlock).  Rule numbers inside 50220 / result set 2: see
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
        AppKnown BIT NULL, AccountBound BIT NULL, FromBound BIT NULL
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
        IF ISJSON(@Mails) = 0 OR LEFT(LTRIM(@Mails), 1) <> N'['
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
            MaxAttempts, IdempotencyKey, Attachments
        )
        SELECT
            CAST(e.[key] AS INT) + 1,
            f.ToAddress, f.Subject, f.Body, f.BodyFormat, f.TextBody, f.CC, f.BCC, f.FromAddress,
            f.FromName, f.ReplyTo, COALESCE(f.HeadersObject, f.HeadersText), f.AccountName, f.AppName,
            TRY_CONVERT(INT, f.Priority),
            TRY_CONVERT(DATETIME2(3), f.DateToProcess, 127),
            TRY_CONVERT(DATETIME2(3), f.ExpiresAtUtc, 127),
            TRY_CONVERT(INT, f.MaxAttempts),
            f.IdempotencyKey, COALESCE(f.AttachmentsArray, f.AttachmentsText)
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
                AttachmentsText NVARCHAR(MAX) '$.Attachments'
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
                        N'Attachments'
                    )
                        THEN CONCAT(
                            N'''', LEFT(k.[key], 80), N''' is not a field of a mail (names are case-sensitive).'
                        )
                    WHEN k.[type] <> 0 AND k.[key] IN (N'Headers', N'Attachments') THEN NULL
                    WHEN k.[type] = 0 THEN NULL   -- JSON null: the default
                    WHEN k.[key] IN (N'Priority', N'MaxAttempts')
                        AND (k.[type] NOT IN (1, 2) OR TRY_CONVERT(INT, k.[value]) IS NULL)
                        THEN CONCAT(N'''', k.[key], N''' must be an integer.')
                    WHEN k.[key] IN (N'DateToProcess', N'ExpiresAtUtc')
                        AND (k.[type] <> 1 OR TRY_CONVERT(DATETIME2(3), k.[value], 127) IS NULL)
                        THEN CONCAT(N'''', k.[key], N''' must be a UTC time in ISO 8601, e.g. "2030-01-01T08:00:00Z".')
                    WHEN k.[key] NOT IN (N'Priority', N'MaxAttempts')
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
        INSERT INTO #Batch (
            RowNo, ToAddress, Subject, Body, BodyFormat, TextBody, CC, BCC, FromAddress, FromName,
            ReplyTo, Headers, AccountName, AppName, Priority, DateToProcess, ExpiresAtUtc,
            MaxAttempts, IdempotencyKey, Attachments
        )
        SELECT
            r.RowNo, r.ToAddress, r.Subject, r.Body, r.BodyFormat, r.TextBody, r.CC, r.BCC, r.FromAddress,
            r.FromName, r.ReplyTo, r.Headers, r.AccountName, r.AppName, r.Priority, r.DateToProcess,
            r.ExpiresAtUtc, r.MaxAttempts, r.IdempotencyKey, r.Attachments
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
        ContentHash = HASHBYTES('SHA2_256', h.ContentJson)
    FROM #Batch AS b
    LEFT JOIN mailq.SendingAccount AS a
        ON a.AccountName = COALESCE(b.AccountName, @DefaultAccount)
    CROSS APPLY (
        SELECT (
            SELECT
                -- Unaliased columns keep their names: the same JSON as EnqueueMail's
                -- (@ToAddress AS ToAddress, ...), in the same order.
                b.ToAddress, b.CC, b.BCC, b.Subject, b.Body, b.BodyFormat, b.TextBody,
                b.FromAddress, b.FromName, b.ReplyTo, b.Headers, b.AccountName, b.AppName,
                b.Priority, b.DateToProcess, b.ExpiresAtUtc, b.MaxAttempts, b.Attachments
            FOR JSON PATH, WITHOUT_ARRAY_WRAPPER, INCLUDE_NULL_VALUES
        ) AS ContentJson
    ) AS h;

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
    -- Required values, sizes, CR/LF, body format, priority, attempts, expiry, body size.
    INSERT INTO #Problem (RowNo, RuleOrder, Field, ErrorNumber, Message)
    SELECT b.RowNo, c.RuleOrder, c.Field, c.ErrorNumber, c.Message
    FROM #Batch AS b
    CROSS APPLY (
        VALUES
        (10, N'ToAddress', 50101,
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
        INSERT INTO #Existing (RowNo, MailID, MessageID, ContentHash)
        SELECT b.RowNo, q.ID, q.MessageID, q.ContentHash
        FROM #Batch AS b
        INNER JOIN mailq.MailQueue AS q
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

        -- The one INSERT of the mails: every valid row that creates a mail
        -- (no key, or the key's leader with no mail yet).  MessageID is unique
        -- per row (NEWID), so OUTPUT ... INTO maps IDs back to rows by it.
        INSERT INTO mailq.MailQueue (
            dtStamp, DateToProcess, VisibleAtUtc, FromName, FromAddress, ReplyTo,
            ToAddress, CC, BCC, Subject, Body, BodyFormat, TextBody, Headers,
            Status, AttemptsRemaining, Priority, AccountName, AppName,
            IdempotencyKey, ContentHash, MessageID, ExpiresAtUtc
        )
        OUTPUT inserted.ID, inserted.MessageID, inserted.AppName
        INTO #Inserted (MailID, MessageID, AppName)
        SELECT
            @Now, b.DueUtc AS DateToProcess, b.DueUtc AS VisibleAtUtc, b.EffFromName, b.EffFromAddress,
            LTRIM(RTRIM(b.ReplyTo)),
            b.ToAddress, b.CC, b.BCC, b.Subject, b.Body, COALESCE(b.BodyFormat, N'Text'), b.TextBody, b.Headers,
            N'UnSent', COALESCE(b.MaxAttempts, 5), COALESCE(b.Priority, 5), b.EffAccountName, b.EffAppName,
            b.IdempotencyKey, b.ContentHash, b.MessageID, b.ExpiresAtUtc
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
        -- no event, as in EnqueueMail.  New event rows only: no lock any other
        -- transaction holds or waits for.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT i.MailID, i.AppName, N'Enqueued', N'UnSent', 0, NULL, NULL, @Now
        FROM #Inserted AS i
        ORDER BY i.MailID;

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

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0018 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (
    SELECT 1 FROM sys.tables
    WHERE object_id = OBJECT_ID(N'mailq.MailEvent') AND lock_escalation_desc <> N'TABLE'
)
    ALTER TABLE mailq.MailEvent SET (LOCK_ESCALATION = TABLE);

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0018 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (
    SELECT 1 FROM sys.tables
    WHERE object_id = OBJECT_ID(N'mailq.MailAttachment') AND lock_escalation_desc <> N'TABLE'
)
    ALTER TABLE mailq.MailAttachment SET (LOCK_ESCALATION = TABLE);

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0018 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (
    SELECT 1 FROM sys.tables
    WHERE object_id = OBJECT_ID(N'mailq.MailQueue') AND lock_escalation_desc <> N'TABLE'
)
    ALTER TABLE mailq.MailQueue SET (LOCK_ESCALATION = TABLE);

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0018 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0018';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0018 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0014' WHERE dbo.mailq_alembic_version.version_num = '0018';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0014 -> 0013

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0014 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0014')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0014; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0014 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0014 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.EnqueueMailBatch') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMailBatch FROM MailqEnqueuer;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0014 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

REVOKE EXECUTE ON TYPE::mailq.MailBatchRow FROM MailqEnqueuer;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0014 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.EnqueueMailBatch;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0014 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF TYPE_ID(N'mailq.MailBatchRow') IS NOT NULL
    DROP TYPE mailq.MailBatchRow;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0014 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0014';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0014 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0013' WHERE dbo.mailq_alembic_version.version_num = '0014';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0013 -> 0012

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0013')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0013; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.AddMailTemplateVersion') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.AddMailTemplateVersion FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetMailTemplate') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailTemplate FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ListMailTemplates') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ListMailTemplates FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ListMailTemplateVersions') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ListMailTemplateVersions FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RetireMailTemplate') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RetireMailTemplate FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetMailTemplate') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailTemplate FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.RetireMailTemplate;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.ListMailTemplateVersions;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.ListMailTemplates;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.GetMailTemplate;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.AddMailTemplateVersion;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TRIGGER IF EXISTS mailq.trg_MailTemplateVersion_Immutable;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.MailTemplateVersion;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.MailTemplate;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0013';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0013 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0012' WHERE dbo.mailq_alembic_version.version_num = '0013';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0012 -> 0011

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0012')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0012; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.EnqueueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ClaimMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ExtendLease') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ExtendLease FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ReleaseMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ReleaseMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkSent') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkSent FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkFailed') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkFailed FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RequeueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RequeueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.CancelMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.CancelMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.PurgeMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.PurgeMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertSendingAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UnblockSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UnblockSendingAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.BindApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.BindApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UnbindApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UnbindApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MoveBodiesOutOfRow') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MoveBodiesOutOfRow FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetQueueStats') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetQueueStats FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetInstallationHealth') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetInstallationHealth FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.QueueCountsByStatus') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.QueueCountsByStatus FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.OldestDueMail') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.OldestDueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ThroughputPerHour') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.ThroughputPerHour FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RecentFailures') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.RecentFailures FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetMailEvents') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailEvents FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.StopMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.StopMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.AcquireLoginSlot') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.AcquireLoginSlot FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
Grants of role MailqAdmin: every public mailq procedure and the reporting
views (views are read-only reports, not table rights).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RequeueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.CancelMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.PurgeMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UnblockSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.BindApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UnbindApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MoveBodiesOutOfRow TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetQueueStats TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.QueueCountsByStatus TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.OldestDueMail TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.ThroughputPerHour TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecentFailures TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailEvents TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.StopMail TO MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ClaimMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimMail FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ExtendLease') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ExtendLease FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ReleaseMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ReleaseMail FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkSent') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkSent FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkFailed') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkFailed FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetInstallationHealth') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetInstallationHealth FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.AcquireLoginSlot') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.AcquireLoginSlot FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
Grants of role MailqSender (sender workers): claim, extend, release and
acknowledge mail, and read the installation health for `mailq-db doctor`.
No grant on mailq.EnqueueMail: a worker's login cannot enqueue (issue 10,
point 10; tests/integration/test_mailq_roles.py).
*/
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.AcquireLoginSlot;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.UpsertSendingAccount: creates a sending account or changes its
settings (and creates its rate budget row).  SMTP host and credentials are
not stored: the worker's configuration maps the account name to them.
Parameters:  @AccountName NVARCHAR(128), required
             @DefaultFromAddress NVARCHAR(320), required: one bare address
                        (the display name goes in @DefaultFromName)
             @DefaultFromName NVARCHAR(200), optional
             @PerMinuteLimit, @PerHourLimit, @PerDayLimit INT > 0, NULL = unlimited
             @IsDefault BIT, default 0: 1 makes this the account EnqueueMail
                        uses when @AccountName is NULL (the previous default is cleared)
Result set:  none.
Errors:      50142 @AccountName missing; 50103 a value over its size;
             50102 @DefaultFromAddress invalid; 50143 a limit not positive.
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms (XACT_STATE() = -1)
             or rolls back the caller's transaction, so the caller must roll back.
Isolation:   sets READ COMMITTED itself (UPDLOCK, HOLDLOCK insert-if-absent on a
             small admin table).
Lock order:  mailq.SendingAccount, then mailq.RateBudget (only the new account's
             row, which no other transaction can hold yet).
Example:     EXEC mailq.UpsertSendingAccount @AccountName = N'qq',
                 @DefaultFromAddress = N'noreply@example.com', @PerMinuteLimit = 20,
                 @PerHourLimit = 500, @PerDayLimit = 5000, @IsDefault = 1;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertSendingAccount
    @AccountName NVARCHAR(4000),
    @DefaultFromAddress NVARCHAR(4000),
    @DefaultFromName NVARCHAR(4000) = NULL,
    @PerMinuteLimit INT = NULL,
    @PerHourLimit INT = NULL,
    @PerDayLimit INT = NULL,
    @IsDefault BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    SET @IsDefault = COALESCE(@IsDefault, 0);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;
    IF LEN(@AccountName) > 128 OR LEN(@DefaultFromAddress) > 320 OR LEN(@DefaultFromName) > 200
        THROW 50103, N'@AccountName (128), @DefaultFromAddress (320) or @DefaultFromName (200) is over its size.', 1;
    IF @DefaultFromName COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(13) + NCHAR(10) + N']%'
        THROW 50105, N'@DefaultFromName contains CR or LF (header injection is refused).', 1;
    IF
        @DefaultFromAddress IS NULL
        OR (SELECT COUNT(*) FROM mailq.ParseAddressList(@DefaultFromAddress)) <> 1
        OR EXISTS (
            SELECT 1
            FROM mailq.ParseAddressList(@DefaultFromAddress) AS a
            WHERE a.Problem IS NOT NULL OR a.DisplayName IS NOT NULL
        )
    BEGIN
        SET @Msg = CONCAT(
            N'@DefaultFromAddress must be one valid address; got ''', LEFT(@DefaultFromAddress, 100), N'''.'
        );
        THROW 50102, @Msg, 1;
    END;
    IF @PerMinuteLimit <= 0 OR @PerHourLimit <= 0 OR @PerDayLimit <= 0
        THROW 50143, N'@PerMinuteLimit, @PerHourLimit and @PerDayLimit must be positive, or NULL for no limit.', 1;

    -- Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        IF @IsDefault = 1
            UPDATE a
            SET a.IsDefault = 0
            FROM mailq.SendingAccount AS a
            WHERE a.IsDefault = 1 AND a.AccountName <> @AccountName;

        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race between two callers.
        IF EXISTS (
            SELECT 1
            FROM mailq.SendingAccount AS a WITH (UPDLOCK, HOLDLOCK)
            WHERE a.AccountName = @AccountName
        )
            UPDATE a
            SET
                a.DefaultFromAddress = LTRIM(RTRIM(@DefaultFromAddress)),
                a.DefaultFromName = @DefaultFromName,
                a.PerMinuteLimit = @PerMinuteLimit,
                a.PerHourLimit = @PerHourLimit,
                a.PerDayLimit = @PerDayLimit,
                a.IsDefault = @IsDefault
            FROM mailq.SendingAccount AS a
            WHERE a.AccountName = @AccountName;
        ELSE
            INSERT INTO mailq.SendingAccount (
                AccountName, DefaultFromAddress, DefaultFromName,
                PerMinuteLimit, PerHourLimit, PerDayLimit, IsDefault
            )
            VALUES (
                @AccountName, LTRIM(RTRIM(@DefaultFromAddress)), @DefaultFromName,
                @PerMinuteLimit, @PerHourLimit, @PerDayLimit, @IsDefault
            );

        IF NOT EXISTS (SELECT 1 FROM mailq.RateBudget AS b WHERE b.AccountName = @AccountName)
            INSERT INTO mailq.RateBudget (AccountName) VALUES (@AccountName);

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.CK_SendingAccount_LoginInterval', N'C') IS NOT NULL
    ALTER TABLE mailq.SendingAccount DROP CONSTRAINT CK_SendingAccount_LoginInterval;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF COL_LENGTH(N'mailq.SendingAccount', N'LastLoginAtUtc') IS NOT NULL
    ALTER TABLE mailq.SendingAccount DROP COLUMN LastLoginAtUtc;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF COL_LENGTH(N'mailq.SendingAccount', N'MinLoginIntervalMs') IS NOT NULL
    ALTER TABLE mailq.SendingAccount DROP COLUMN MinLoginIntervalMs;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.SendingAccount: one row per sending account (TinyMail's "multiple
accounts").  SMTP host and credentials never live here: the worker's
configuration maps AccountName to them.
    PerMinuteLimit / PerHourLimit / PerDayLimit  NULL = unlimited; enforced at
        claim time across every worker (see mailq.RateBudget, mailq.ClaimMail).
    BlockedUntilUtc  set by MarkFailed @Disposition = 'Wait' (provider
        throttling or account lock); no mail of the account is claimed before it.
    IsDefault        the account EnqueueMail uses when @AccountName is NULL
        (at most one, enforced by UX_SendingAccount_IsDefault).
*/
IF OBJECT_ID(N'mailq.SendingAccount', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.SendingAccount (
        AccountName NVARCHAR(128) NOT NULL,
        DefaultFromAddress NVARCHAR(320) NOT NULL,
        DefaultFromName NVARCHAR(200) NULL,
        PerMinuteLimit INT NULL,
        PerHourLimit INT NULL,
        PerDayLimit INT NULL,
        BlockedUntilUtc DATETIME2(3) NULL,
        BlockReason NVARCHAR(4000) NULL,
        IsDefault BIT NOT NULL CONSTRAINT DF_SendingAccount_IsDefault DEFAULT (0),
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_SendingAccount_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_SendingAccount PRIMARY KEY CLUSTERED (AccountName),
        CONSTRAINT CK_SendingAccount_Limits CHECK (
            (PerMinuteLimit IS NULL OR PerMinuteLimit > 0)
            AND (PerHourLimit IS NULL OR PerHourLimit > 0)
            AND (PerDayLimit IS NULL OR PerDayLimit > 0)
        )
    );
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0012';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0012 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0011' WHERE dbo.mailq_alembic_version.version_num = '0012';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0011 -> 0010

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0011')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0011; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.sysmail_allitems: msdb.dbo.sysmail_allitems's columns (names and types
as documented,
https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-allitems-transact-sql)
over this queue, so that a monitoring query written for Database Mail runs
here by changing msdb.dbo to mailq.  Lower-case names on purpose: they are
Database Mail's.
Rows:        every mail of the queue.  db_owner and MailqAdmin members see all
             of them; anybody else only the mail they sent through
             mailq.SendDbMail (as in msdb, where only sysadmin sees all).
Mapping:     mailitem_id = MailQueue.ID (NULL above 2,147,483,647);
             sent_status: Sent -> sent; Failed, Cancelled, Expired -> failed;
             UnSent or Sending after a failed attempt -> retrying; else unsent.
             Dates are the server's local time (datetime, as msdb shows them):
             the queue's UTC times plus the server's current UTC offset.
             Text columns keep the documented types: body, recipients and query
             are varchar(max) there, so characters outside the database's code
             page show as '?'; mailq.MailQueue keeps the Unicode original.
             profile_id and the query columns come from mailq.DbMailItem (NULL
             for mail queued by mailq.EnqueueMail); file_attachments lists
             the mail's attachment file names; sent_account_id is the
             account's mailq.DbMailAccount ID (NULL for an account in no profile).
*/
CREATE OR ALTER VIEW mailq.sysmail_allitems
AS
-- The server's current offset from UTC (SYSDATETIME is local time; on Azure
-- SQL Database both are UTC).  SQL Server 2019 has no CURRENT_TIMEZONE_ID, so
-- rows from the other side of a daylight-saving change are an hour off.
WITH Clock AS (
    SELECT DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()) AS OffsetMinutes
)

SELECT
    CAST(IIF(q.ID <= 2147483647, q.ID, NULL) AS INT) AS mailitem_id,
    i.ProfileID AS profile_id,
    CAST(q.ToAddress AS VARCHAR(MAX)) AS recipients,
    CAST(q.CC AS VARCHAR(MAX)) AS copy_recipients,
    CAST(q.BCC AS VARCHAR(MAX)) AS blind_copy_recipients,
    CAST(q.Subject AS NVARCHAR(510)) AS subject,
    CAST(q.Body AS VARCHAR(MAX)) AS body,
    CAST(UPPER(q.BodyFormat) AS VARCHAR(20)) AS body_format,
    CAST(COALESCE(i.Importance, 'NORMAL') AS VARCHAR(6)) AS importance,
    CAST(COALESCE(i.Sensitivity, 'NORMAL') AS VARCHAR(12)) AS sensitivity,
    CAST(f.FileNames AS VARCHAR(MAX)) AS file_attachments,
    CAST('MIME' AS VARCHAR(20)) AS attachment_encoding,
    CAST(i.Query AS VARCHAR(MAX)) AS query,
    CAST(i.ExecuteQueryDatabase AS SYSNAME) AS execute_query_database,
    i.AttachQueryResultAsFile AS attach_query_result_as_file,
    i.QueryResultHeader AS query_result_header,
    i.QueryResultWidth AS query_result_width,
    CAST(i.QueryResultSeparator AS CHAR(1)) AS query_result_separator,
    i.ExcludeQueryOutput AS exclude_query_output,
    i.AppendQueryError AS append_query_error,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, q.dtStamp) AS DATETIME) AS send_request_date,
    CAST(i.SendRequestUser AS SYSNAME) AS send_request_user,
    da.AccountID AS sent_account_id,
    CAST(
        CASE
            WHEN q.Status = N'Sent' THEN 'sent'
            WHEN q.Status IN (N'Failed', N'Cancelled', N'Expired') THEN 'failed'
            WHEN q.AttemptCount > 0 AND q.LastError IS NOT NULL THEN 'retrying'
            ELSE 'unsent'
        END AS VARCHAR(8)
    ) AS sent_status,
    CAST(
        IIF(
            q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired'),
            DATEADD(MINUTE, k.OffsetMinutes, COALESCE(q.SentAtUtc, q.DateProcessed)),
            NULL
        ) AS DATETIME
    ) AS sent_date,
    CAST(
        DATEADD(MINUTE, k.OffsetMinutes, COALESCE(q.DateProcessed, q.dtStamp)) AS DATETIME
    ) AS last_mod_date,
    CAST(i.SendRequestUser AS SYSNAME) AS last_mod_user
FROM mailq.MailQueue AS q
CROSS JOIN Clock AS k
LEFT JOIN mailq.DbMailItem AS i ON q.ID = i.MailID
LEFT JOIN mailq.DbMailAccount AS da ON q.AccountName = da.AccountName
OUTER APPLY (
    SELECT STRING_AGG(CONVERT(NVARCHAR(MAX), t.FileName), N';') WITHIN GROUP (ORDER BY t.AttachmentNo) AS FileNames
    FROM mailq.MailAttachment AS t
    WHERE t.MailID = q.ID
) AS f
WHERE
    IS_MEMBER(N'db_owner') = 1
    OR IS_MEMBER(N'MailqAdmin') = 1
    OR i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME());

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.EnqueueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ClaimMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ExtendLease') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ExtendLease FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ReleaseMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ReleaseMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkSent') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkSent FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkFailed') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkFailed FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RequeueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RequeueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.CancelMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.CancelMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.PurgeMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.PurgeMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertSendingAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UnblockSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UnblockSendingAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.BindApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.BindApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UnbindApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UnbindApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MoveBodiesOutOfRow') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MoveBodiesOutOfRow FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetQueueStats') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetQueueStats FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetInstallationHealth') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetInstallationHealth FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.QueueCountsByStatus') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.QueueCountsByStatus FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.OldestDueMail') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.OldestDueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ThroughputPerHour') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.ThroughputPerHour FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RecentFailures') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.RecentFailures FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetMailEvents') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailEvents FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.StopMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.StopMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
Grants of role MailqAdmin: every public mailq procedure and the reporting
views (views are read-only reports, not table rights).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RequeueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.CancelMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.PurgeMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UnblockSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.BindApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UnbindApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MoveBodiesOutOfRow TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetQueueStats TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.QueueCountsByStatus TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.OldestDueMail TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.ThroughputPerHour TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecentFailures TO MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.EnqueueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMail FROM MailqEnqueuer;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetMailEvents') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailEvents FROM MailqEnqueuer;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
Grants of role MailqEnqueuer: enqueue mail, nothing else.  Object-level
grants (not SCHEMA::mailq) so that internal procedures such as
mailq.LockLeasedMail stay out of reach.  The enqueue role cannot claim or
acknowledge (no grant on mailq.ClaimMail, MarkSent...), cannot change its own
bindings (mailq.BindApplication is MailqAdmin's), and what it may send as is
limited per application by mailq.ApplicationAccount / mailq.ApplicationFrom
(tests/integration/test_mailq_roles.py).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqEnqueuer;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.StopMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.GetMailEvents;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.PurgeMail: deletes finished mail (Sent, Failed, Cancelled, Expired)
whose DateProcessed is older than @OlderThanDays days, with its attempts and
attachments.  Works in batches of @BatchSize mails, one short transaction
per batch.  Rows locked by others are skipped (READPAST) and picked up by
the next purge.
Batch size and lock escalation: SQL Server escalates to a table lock when
one statement takes 5,000 locks on one index (or one table) reference
("Lock escalation" in Microsoft's transaction locking and row versioning
guide).  Every statement here stays far below: the parent delete touches at
most @BatchSize <= 1000 rows per index, children are deleted 1000 rows per
statement (recipient outcomes too, before the parent delete, whose ON DELETE
CASCADE would otherwise remove up to 100 of them per mail in one statement).
The queue stays available to workers and enqueuers meanwhile.
Parameters:  @OlderThanDays INT 0-36500 (100 years), required;
             @BatchSize INT 1-1000, default 500.
Result set:  one row: PurgedCount BIGINT.
Errors:      50135 @OlderThanDays missing or negative; 50163 @OlderThanDays
             over 36500 (the cutoff date would underflow, error 517);
             50140 @BatchSize out of range; 50141 called inside a transaction.
Transaction: must not be called inside a transaction (50141): each batch
             commits on its own, which is the point.  An error rolls back the
             current batch only (earlier batches stay purged) and is re-raised.
Isolation:   sets READ COMMITTED itself (READPAST is refused under SERIALIZABLE,
             REPEATABLE READ and SNAPSHOT, error 650); the candidate read says
             READCOMMITTEDLOCK so that, under READ_COMMITTED_SNAPSHOT, it sees
             locks and READPAST can skip them.
Lock order:  mailq.MailQueue clustered rows first (U, in ID order), then
             mailq.MailAttempt, then mailq.MailAttachment, then
             mailq.MailRecipientOutcome, then the MailQueue
             rows' deletion: the order of every procedure (docs/guarantees.md).
             The candidates are found on IX_MailQueue_Final without keeping a
             lock on it, so RequeueMail (clustered row, then the index key)
             can no longer deadlock with a purge (issue 10, point 7).
Example:     EXEC mailq.PurgeMail @OlderThanDays = 30;
*/
CREATE OR ALTER PROCEDURE mailq.PurgeMail
    @OlderThanDays INT,
    @BatchSize INT = 500
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    IF @OlderThanDays IS NULL OR @OlderThanDays < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@OlderThanDays must be 0 or more; got ', COALESCE(CAST(@OlderThanDays AS NVARCHAR(12)), N'NULL'), N'.'
        );
        THROW 50135, @Msg, 1;
    END;
    IF @OlderThanDays > 36500
    BEGIN
        SET @Msg = CONCAT(N'@OlderThanDays must be at most 36500 (100 years); got ', @OlderThanDays, N'.');
        THROW 50163, @Msg, 1;
    END;
    SET @BatchSize = COALESCE(@BatchSize, 500);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50140, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50141, N'mailq.PurgeMail commits batch by batch: call it outside a transaction.', 1;

    DECLARE @Cutoff DATETIME2(3) = DATEADD(DAY, -@OlderThanDays, SYSUTCDATETIME());
    DECLARE @Purged BIGINT = 0;
    DECLARE @Candidate TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Batch TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Deleted INT;

    WHILE 1 = 1
    BEGIN
        DELETE FROM @Candidate;
        DELETE FROM @Batch;
        BEGIN TRY
            BEGIN TRANSACTION;

            -- 1. Candidates: a range seek on IX_MailQueue_Final (covering),
            --    oldest first.  READCOMMITTEDLOCK, READPAST, ROWLOCK: S locks
            --    released row by row, rows others hold are skipped; nothing on
            --    the index stays locked while the rows below are taken.
            INSERT INTO @Candidate (ID)
            SELECT TOP (@BatchSize) q.ID
            FROM mailq.MailQueue AS q WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired')
                AND q.DateProcessed < @Cutoff
            ORDER BY q.DateProcessed ASC, q.ID ASC;

            IF @@ROWCOUNT = 0
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            -- 2. Lock the batch on the clustered index (the first lock every
            --    procedure takes on a mail) and re-check: a candidate may have
            --    been requeued in between.  FORCESEEK on the primary key keeps
            --    the plan off IX_MailQueue_Final.
            INSERT INTO @Batch (ID)
            SELECT q.ID
            FROM @Candidate AS c
            INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)), UPDLOCK, READPAST, ROWLOCK)
                ON c.ID = q.ID
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired')
                AND q.DateProcessed < @Cutoff;

            -- Every candidate was taken or changed meanwhile: stop here rather
            -- than spin; the next purge picks them up.
            IF NOT EXISTS (SELECT 1 FROM @Batch)
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            -- 3. Children, 1000 rows per statement, attempts before attachments.
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) t
                FROM mailq.MailAttempt AS t WITH (ROWLOCK)
                WHERE t.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;

            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) a
                FROM mailq.MailAttachment AS a WITH (ROWLOCK)
                WHERE a.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;

            -- Recipient outcomes (up to 100 per mail) here too, not through the
            -- ON DELETE CASCADE of the parent delete: that one statement would
            -- lock up to 100 x @BatchSize rows of mailq.MailRecipientOutcome
            -- and escalate to a table lock past 5,000.
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) o
                FROM mailq.MailRecipientOutcome AS o WITH (ROWLOCK)
                WHERE o.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;

            -- 4. The mails themselves (rows already held since step 2).
            DELETE q
            FROM mailq.MailQueue AS q WITH (ROWLOCK)
            WHERE q.ID IN (SELECT b.ID FROM @Batch AS b);
            SET @Purged += @@ROWCOUNT;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;
    END;

    SELECT @Purged AS PurgedCount;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.RequeueMail: puts a Failed, Cancelled or Expired mail back in the
queue (UnSent) with a fresh set of attempts; PossibleDuplicate and the
attempt history are kept.  An expiry time that is not after the new due time
is cleared (the mail would otherwise expire at once).
Parameters:  @ID BIGINT, required; @MaxAttempts INT 1-20, default 5;
             @DateToProcess DATETIME2(3) UTC, default now.
Result set:  one row: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50136 @ID missing; 50119 @MaxAttempts out of range;
             50201 unknown mail; 50205 the mail is not Failed, Cancelled or Expired.
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms (XACT_STATE() = -1)
             or rolls back the caller's transaction, so the caller must roll back.
Isolation:   sets READ COMMITTED itself (UPDLOCK check-then-update; a level set
             in a procedure reverts when it returns).
Lock order:  mailq.MailQueue only (clustered row first, as PurgeMail).
Example:     EXEC mailq.RequeueMail @ID = 101, @MaxAttempts = 3;
*/
CREATE OR ALTER PROCEDURE mailq.RequeueMail
    @ID BIGINT,
    @MaxAttempts INT = 5,
    @DateToProcess DATETIME2(3) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50136, N'@ID is required.', 1;
    SET @MaxAttempts = COALESCE(@MaxAttempts, 5);
    IF @MaxAttempts NOT BETWEEN 1 AND 20
    BEGIN
        SET @Msg = CONCAT(N'@MaxAttempts must be 1-20; got ', @MaxAttempts, N'.');
        THROW 50119, @Msg, 1;
    END;
    SET @DateToProcess = COALESCE(@DateToProcess, SYSUTCDATETIME());

    DECLARE @Status NVARCHAR(16);
    -- Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        -- UPDLOCK: check and change under one lock.
        SELECT @Status = q.Status
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @ID;

        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status NOT IN (N'Failed', N'Cancelled', N'Expired')
        BEGIN
            SET @Msg = CONCAT(
                N'Mail ', @ID, N' is ', @Status, N'; only Failed, Cancelled or Expired mail can be requeued.'
            );
            THROW 50205, @Msg, 1;
        END;

        UPDATE q
        SET
            q.Status = N'UnSent',
            q.DateToProcess = @DateToProcess,
            q.VisibleAtUtc = @DateToProcess,
            q.AttemptsRemaining = @MaxAttempts,
            q.ExpiresAtUtc = IIF(q.ExpiresAtUtc > @DateToProcess, q.ExpiresAtUtc, NULL),
            q.DateProcessed = NULL
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        @ID AS ID,
        N'UnSent' AS Status,
        @DateToProcess AS NextAttemptUtc;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.CancelMail: cancels a mail that is waiting to be sent (UnSent).  A mail
being sent (Sending) cannot be cancelled safely: the SMTP server may already
have it; cancel again after it was acknowledged, or let it finish.
Parameters:  @ID BIGINT, required.
Result set:  one row: ID, Status ('Cancelled'), NextAttemptUtc (NULL).
Errors:      50136 @ID missing; 50201 unknown mail; 50204 the mail is not UnSent.
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms (XACT_STATE() = -1)
             or rolls back the caller's transaction, so the caller must roll back.
Isolation:   sets READ COMMITTED itself (UPDLOCK check-then-update; a level set
             in a procedure reverts when it returns).
Lock order:  mailq.MailQueue only.
Example:     EXEC mailq.CancelMail @ID = 101;
*/
CREATE OR ALTER PROCEDURE mailq.CancelMail
    @ID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50136, N'@ID is required.', 1;

    DECLARE @Status NVARCHAR(16);
    -- Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        -- UPDLOCK: read and change the row under one lock, so a claim cannot
        -- slip in between the check and the update.
        SELECT @Status = q.Status
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @ID;

        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status <> N'UnSent'
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' is ', @Status, N'; only an UnSent mail can be cancelled.');
            THROW 50204, @Msg, 1;
        END;

        UPDATE q
        SET
            q.Status = N'Cancelled',
            q.DateProcessed = SYSUTCDATETIME()
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        @ID AS ID,
        N'Cancelled' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.MarkFailed: records a failed attempt; fenced by the lock token, all or
nothing.  @Disposition follows TinyMail's error classes:
  Retry  transient (4xx on the mail, dropped connection, timeout): the attempt
         is consumed; the mail is UnSent again after @RetryAfterSeconds, or
         after exponential backoff with jitter: 30 s * 2^(attempt-1), at most
         1 hour, times a random 0.8-1.2; Failed when no attempt is left.
  Wait   the account is throttled or locked (421, rate limits): the attempt is
         refunded, the mail is UnSent again after @RetryAfterSeconds (default
         60), and the account is blocked until then (ClaimMail skips it).
  Stop   permanent (5xx, malformed mail): Failed at once.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required; @Disposition NVARCHAR(8),
             required; @Error NVARCHAR(4000), required: what happened;
             @RetryAfterSeconds INT 0-604800, optional; @SmtpCode INT 200-599, optional.
Result set:  one row per mail: ID, Status (UnSent or Failed), NextAttemptUtc
             (NULL when Failed).
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail);
             50133 @Disposition unknown; 50134 @RetryAfterSeconds out of range;
             50139 @Error missing; 50147 @SmtpCode out of range.
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms (XACT_STATE() = -1)
             or rolls back the caller's transaction, so the caller must roll back.
Isolation:   sets READ COMMITTED itself (the fence reads with UPDLOCK).
Lock order:  mailq.MailQueue (via mailq.LockLeasedMail), then mailq.MailAttempt,
             then mailq.SendingAccount (Wait only).
Example:     EXEC mailq.MarkFailed @ID = 101, @LockToken = @T, @Disposition = N'Retry',
                 @Error = N'451 4.3.0 try again later', @SmtpCode = 451;
*/
CREATE OR ALTER PROCEDURE mailq.MarkFailed
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @Disposition NVARCHAR(20),
    @Error NVARCHAR(4000),
    @RetryAfterSeconds INT = NULL,
    @SmtpCode INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    IF @Disposition IS NULL OR @Disposition NOT IN (N'Retry', N'Wait', N'Stop')
    BEGIN
        SET @Msg = CONCAT(N'@Disposition must be Retry, Wait or Stop; got ''', @Disposition, N'''.');
        THROW 50133, @Msg, 1;
    END;
    IF NULLIF(LTRIM(RTRIM(@Error)), N'') IS NULL
        THROW 50139, N'@Error is required: say what failed (the SMTP reply or the exception).', 1;
    IF @RetryAfterSeconds NOT BETWEEN 0 AND 604800
    BEGIN
        SET @Msg = CONCAT(N'@RetryAfterSeconds must be 0-604800 (7 days); got ', @RetryAfterSeconds, N'.');
        THROW 50134, @Msg, 1;
    END;
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @WaitUntil DATETIME2(3) = DATEADD(SECOND, COALESCE(@RetryAfterSeconds, 60), @Now);
    DECLARE @Acked TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AttemptNo INT NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        Status NVARCHAR(16) NOT NULL,
        NextAttemptUtc DATETIME2(3) NULL
    );

    -- Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;

        WITH Outcome AS (
            SELECT
                q.ID,
                q.AccountName,
                q.Status,
                q.ThreadLock,
                q.VisibleAtUtc,
                q.AttemptsRemaining,
                q.AttemptCount,
                q.DateProcessed,
                q.LastError,
                CASE
                    WHEN @Disposition = N'Wait' THEN N'UnSent'
                    WHEN @Disposition = N'Retry' AND q.AttemptsRemaining > 0 THEN N'UnSent'
                    ELSE N'Failed'
                END AS NewStatus,
                CASE
                    WHEN @Disposition = N'Wait' THEN @WaitUntil
                    WHEN @RetryAfterSeconds IS NOT NULL THEN DATEADD(SECOND, @RetryAfterSeconds, @Now)
                    -- Exponential backoff with jitter; NEWID() gives each row its own.
                    ELSE DATEADD(
                        MILLISECOND,
                        CAST(
                            IIF(
                                q.AttemptCount >= 8, 3600,
                                30 * POWER(2, IIF(q.AttemptCount < 1, 0, q.AttemptCount - 1))
                            )
                            -- modulo before ABS: ABS(-2147483648) would overflow
                            * (800 + ABS(CHECKSUM(NEWID()) % 401)) AS INT
                        ),
                        @Now
                    )
                END AS RetryAtUtc
            FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
            INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
            WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken
        )

        UPDATE o
        SET
            o.Status = o.NewStatus,
            o.ThreadLock = NULL,
            o.VisibleAtUtc = IIF(o.NewStatus = N'UnSent', o.RetryAtUtc, o.VisibleAtUtc),
            -- Wait is not the mail's fault: its attempt is refunded.
            o.AttemptsRemaining = o.AttemptsRemaining + IIF(@Disposition = N'Wait', 1, 0),
            o.DateProcessed = @Now,
            o.LastError = @Error
        OUTPUT
            inserted.ID,
            inserted.AttemptCount,
            inserted.AccountName,
            inserted.Status,
            IIF(inserted.Status = N'UnSent', inserted.VisibleAtUtc, NULL)
        INTO @Acked (ID, AttemptNo, AccountName, Status, NextAttemptUtc)
        FROM Outcome AS o;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = @Disposition,
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @Error
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;

        IF @Disposition = N'Wait'
            UPDATE s
            SET
                s.BlockedUntilUtc = IIF(s.BlockedUntilUtc > @WaitUntil, s.BlockedUntilUtc, @WaitUntil),
                s.BlockReason = @Error
            FROM mailq.SendingAccount AS s
            WHERE s.AccountName IN (SELECT a.AccountName FROM @Acked AS a);

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        a.ID,
        a.Status,
        a.NextAttemptUtc
    FROM @Acked AS a
    ORDER BY a.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.MarkSent: records mails as sent; fenced by the lock token and all or
nothing, so one call acknowledges every mail sent on one SMTP connection.
Repeatable: a mail this token already marked Sent is accepted again and left
unchanged, so a worker whose connection dropped before the reply can simply
call again.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array of 1-1000 IDs):
             exactly one; @LockToken UNIQUEIDENTIFIER, required;
             @SmtpCode INT 200-599 and @SmtpText NVARCHAR(4000): the server's
             final reply, optional; @DryRun BIT, default 0: 1 records that
             nothing was sent (worker dry-run mode).
Result set:  one row per mail named: ID, Status ('Sent'), NextAttemptUtc (NULL).
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail);
             50147 @SmtpCode out of range.  On any error nothing is written.
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms (XACT_STATE() = -1)
             or rolls back the caller's transaction, so the caller must roll back.
Isolation:   sets READ COMMITTED itself (the fence reads with UPDLOCK).
Lock order:  mailq.MailQueue (via mailq.LockLeasedMail), then mailq.MailAttempt.
Example:     EXEC mailq.MarkSent @IDList = N'[101,102]', @LockToken = @T, @SmtpCode = 250;
*/
CREATE OR ALTER PROCEDURE mailq.MarkSent
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @SmtpCode INT = NULL,
    @SmtpText NVARCHAR(4000) = NULL,
    @DryRun BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    SET @DryRun = COALESCE(@DryRun, 0);
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Acked TABLE (ID BIGINT NOT NULL PRIMARY KEY, AttemptNo INT NOT NULL);

    -- Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        EXEC mailq.LockLeasedMail
            @ID = @ID, @IDList = @IDList, @LockToken = @LockToken, @AcceptSentByToken = 1;

        UPDATE q
        SET
            q.Status = N'Sent',
            q.ThreadLock = NULL,
            q.SentAtUtc = @Now,
            q.DateProcessed = @Now,
            q.DryRun = @DryRun,
            q.LastError = NULL
        OUTPUT inserted.ID, inserted.AttemptCount INTO @Acked (ID, AttemptNo)
        FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = IIF(@DryRun = 1, N'DryRun', N'Sent'),
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @SmtpText
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        l.ID,
        N'Sent' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc
    FROM mailq.ParseIDList(@ID, @IDList) AS l
    ORDER BY l.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.ReleaseMail: gives back mails a worker holds but has not sent (e.g. on
shutdown): UnSent and due now, the attempt refunded, the attempt row closed
as Released.  Fenced by the lock token, all or nothing.  The rate budget the
claim took is not refunded (limits stay conservative).
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required.
Result set:  one row per mail: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail).
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms (XACT_STATE() = -1)
             or rolls back the caller's transaction, so the caller must roll back.
Isolation:   sets READ COMMITTED itself (the fence reads with UPDLOCK).
Lock order:  mailq.MailQueue (via mailq.LockLeasedMail), then mailq.MailAttempt.
Example:     EXEC mailq.ReleaseMail @IDList = N'[103,104]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.ReleaseMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Released TABLE (ID BIGINT NOT NULL PRIMARY KEY, AttemptNo INT NOT NULL);

    -- Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;

        UPDATE q
        SET
            q.Status = N'UnSent',
            q.ThreadLock = NULL,
            q.VisibleAtUtc = @Now,
            q.AttemptsRemaining = q.AttemptsRemaining + 1
        OUTPUT inserted.ID, inserted.AttemptCount INTO @Released (ID, AttemptNo)
        FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Released'
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Released AS r ON t.MailID = r.ID AND t.AttemptNo = r.AttemptNo;

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SELECT
        r.ID,
        N'UnSent' AS Status,
        @Now AS NextAttemptUtc
    FROM @Released AS r
    ORDER BY r.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.FinalizeMail: moves queued mail that can never be sent to its final
state, in small batches, so that the claim never has to (issue 10, point 2):
  * out of attempts: UnSent/Sending, AttemptsRemaining = 0, lease expired
    (the worker holding the last attempt died or stalled) -> Failed,
    "No attempt left after an abandoned lease. Last error: ...";
  * expired: UnSent (due or not), or Sending with an expired lease, whose
    ExpiresAtUtc passed -> Expired.  A live lease is left to its worker.
Whatever the account: blocked accounts and accounts no worker serves
included (their mail expires as docs/guarantees.md promises).  A reclaimed
lease is flagged PossibleDuplicate and its open attempt closed 'Abandoned',
as ClaimMail does when it reclaims.  Out of attempts wins over expired.

Each batch is one short transaction of at most @BatchSize mails per
statement: a range seek on IX_MailQueue_Finalize / IX_MailQueue_Expiry, TOP,
clustered seeks; reads and locks proportional to @BatchSize (far below the
5,000 locks per statement that trigger lock escalation).  Batches repeat
until one finds fewer than @BatchSize mails or @MaxBatches ran; the next
call continues.  Workers call it on a timer (src/mailq_db/worker/loop.py,
every 60 s); a SQL Agent job or an elastic job can call it instead (see
docs/finalization.md).

Parameters:  @BatchSize  INT 1-1000, default 200: mails per statement
             @MaxBatches INT 1-1000, default 50: batches per call
Result set:  one row: FailedCount INT, ExpiredCount INT, MoreLeft BIT
             (1: the last batch was full; call again)
Errors:      50150 @BatchSize out of range; 50151 @MaxBatches out of range;
             50152 called inside a transaction.
Transaction: must not be called inside a transaction (50152): each batch
             commits on its own, which is what keeps it small.  An error
             rolls back the batch under way (earlier batches stay) and is
             re-raised.
Isolation:   sets READ COMMITTED itself (READPAST needs it, error 650).
Lock order:  mailq.MailQueue (U -> X), then mailq.MailAttempt (X), as in
             mailq.ClaimMail.
Example:     EXEC mailq.FinalizeMail @BatchSize = 200, @MaxBatches = 50;
*/
CREATE OR ALTER PROCEDURE mailq.FinalizeMail
    @BatchSize INT = 200,
    @MaxBatches INT = 50
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- READPAST needs READ COMMITTED (error 650 under SERIALIZABLE / SNAPSHOT);
    -- the caller's level comes back when the procedure returns.
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    SET @BatchSize = COALESCE(@BatchSize, 200);
    SET @MaxBatches = COALESCE(@MaxBatches, 50);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50150, @Msg, 1;
    END;
    IF @MaxBatches NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@MaxBatches must be 1-1000; got ', @MaxBatches, N'.');
        THROW 50151, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50152, N'mailq.FinalizeMail commits batch by batch: call it outside a transaction.', 1;

    DECLARE @Done TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        NewStatus NVARCHAR(16) NOT NULL,
        OldStatus NVARCHAR(16) NOT NULL,
        OldLockToken UNIQUEIDENTIFIER NULL
    );
    DECLARE @Now DATETIME2(3);
    DECLARE @Failed INT = 0;
    DECLARE @Expired INT = 0;
    DECLARE @Rows INT;
    DECLARE @ExpiredRows INT;
    DECLARE @Batches INT = 0;
    DECLARE @MoreLeft BIT = 0;

    WHILE @Batches < @MaxBatches
    BEGIN
        SET @Batches += 1;
        SET @Now = SYSUTCDATETIME();
        DELETE FROM @Done;
        BEGIN TRY
            BEGIN TRANSACTION;

            -- Out of attempts, lease expired.  IX_MailQueue_Finalize: range
            -- seek on VisibleAtUtc <= @Now within its filter.
            --   READPAST: skip rows others hold (a worker acknowledging its
            --     last attempt right now), never wait on them;
            --   UPDLOCK, ROWLOCK: row-grain update locks while reading.
            WITH Dead AS (
                SELECT TOP (@BatchSize)
                    q.ID,
                    q.Status,
                    q.ThreadLock,
                    q.PossibleDuplicate,
                    q.DateProcessed,
                    q.LastError
                FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Finalize), READPAST, UPDLOCK, ROWLOCK)
                WHERE
                    q.Status IN (N'UnSent', N'Sending')
                    AND q.AttemptsRemaining = 0
                    AND q.VisibleAtUtc <= @Now
                ORDER BY q.VisibleAtUtc ASC, q.ID ASC
            )

            UPDATE d
            SET
                d.Status = N'Failed',
                d.ThreadLock = NULL,
                d.PossibleDuplicate = IIF(d.Status = N'Sending', CAST(1 AS BIT), d.PossibleDuplicate),
                d.DateProcessed = @Now,
                d.LastError = LEFT(CONCAT(N'No attempt left after an abandoned lease. Last error: ', d.LastError), 4000)
            OUTPUT inserted.ID, inserted.Status, deleted.Status, deleted.ThreadLock
            INTO @Done (ID, NewStatus, OldStatus, OldLockToken)
            FROM Dead AS d;
            SET @Rows = @@ROWCOUNT;
            SET @Failed += @Rows;
            -- (@Rows: the fuller of the two statements decides whether to go on)

            -- Expired.  IX_MailQueue_Expiry: range seek on ExpiresAtUtc <=
            -- @Now; a live lease (Sending, VisibleAtUtc in the future) is left
            -- to its worker.  Same hints, same reasons.
            WITH Late AS (
                SELECT TOP (@BatchSize)
                    q.ID,
                    q.Status,
                    q.ThreadLock,
                    q.PossibleDuplicate,
                    q.DateProcessed,
                    q.LastError
                FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Expiry), READPAST, UPDLOCK, ROWLOCK)
                WHERE
                    q.Status IN (N'UnSent', N'Sending')
                    AND q.ExpiresAtUtc IS NOT NULL
                    AND q.ExpiresAtUtc <= @Now
                    AND (q.Status = N'UnSent' OR q.VisibleAtUtc <= @Now)
                ORDER BY q.ExpiresAtUtc ASC, q.ID ASC
            )

            UPDATE l
            SET
                l.Status = N'Expired',
                l.ThreadLock = NULL,
                l.PossibleDuplicate = IIF(l.Status = N'Sending', CAST(1 AS BIT), l.PossibleDuplicate),
                l.DateProcessed = @Now,
                l.LastError = N'Expired before it could be sent (ExpiresAtUtc passed).'
            OUTPUT inserted.ID, inserted.Status, deleted.Status, deleted.ThreadLock
            INTO @Done (ID, NewStatus, OldStatus, OldLockToken)
            FROM Late AS l;
            -- Read @@ROWCOUNT once: an assignment resets it.
            SET @ExpiredRows = @@ROWCOUNT;
            SET @Expired += @ExpiredRows;
            IF @ExpiredRows > @Rows SET @Rows = @ExpiredRows;

            -- Close the attempts of the leases given up (seek by mail ID).
            UPDATE t
            SET
                t.EndedAtUtc = @Now,
                t.Outcome = N'Abandoned',
                t.ErrorText = IIF(
                    d.NewStatus = N'Failed',
                    N'Lease expired before the worker acknowledged; no attempt left.',
                    N'Lease expired before the worker acknowledged; the mail expired.'
                )
            FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)
            INNER JOIN @Done AS d
                ON t.MailID = d.ID AND t.LockToken = d.OldLockToken
            WHERE d.OldStatus = N'Sending' AND t.EndedAtUtc IS NULL;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;

        IF @Rows < @BatchSize
        BEGIN
            SET @MoreLeft = 0;
            BREAK;
        END;
        SET @MoreLeft = 1;
    END;

    SELECT @Failed AS FailedCount, @Expired AS ExpiredCount, @MoreLeft AS MoreLeft;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.ClaimMail: leases up to @BatchSize due mails to one worker.  Its cost
is bounded by the batch and the number of accounts that can send now, never
by the backlog that cannot be sent (issue 10, point 1).

Claimable: UnSent and due, or Sending with an expired lease (its worker died
or stalled): VisibleAtUtc <= now in both cases; with an attempt left and not
past ExpiresAtUtc.  Mail past its expiry or out of attempts is never taken
here: mailq.FinalizeMail moves it to Expired/Failed in bounded batches, so
every row this procedure takes is returned to the worker.

How (a small fixed number of statements in one transaction):
 1. Accounts: the sending accounts the worker serves (@AccountNames), that
    are not blocked (BlockedUntilUtc), with what is left of their rate budget.
    Budget rows are read WITH (FORCESEEK, UPDLOCK, READPAST, ROWLOCK), one
    seek per such account (only its row is locked): an account whose
    budget another claimer holds is skipped for this claim, never waited on.
    The clock (@Now) is read AFTER those locks are held, and a stored window
    start later than @Now's window is kept (windows never move backwards), so
    the mails charged to any window never exceed the account's limit, also
    with claimers racing at a window boundary (issue 10, point 6; spin model
    models/mailqueue.pml -DRATE).  Accounts without budget are dropped.  With
    more such accounts than @BatchSize, those without claimable mail are
    dropped (one row-free EXISTS probe each) and @BatchSize of the rest are
    drawn at random per claim (so no account starves and the lock bound
    below holds).
 2. Passes (at most 3): one UPDATE each, driven by those accounts: CROSS APPLY
    a per-account TOP (cap) on IX_MailQueue_ClaimByAccount (FORCESEEK), in
    Priority DESC, VisibleAtUtc, ID order; then TOP (slots left) over those
    rows in round-robin order (each account's 1st mail, then each one's 2nd,
    ...; within a turn highest Priority, then oldest due, then ID).
    Fair share: cap = least of the account's remaining budget and
    FLOOR(slots left / accounts still open), at least 1.  An account that
    yields fewer rows than its cap is drained; the next pass shares the slots
    left among the others (max-min fairness).  Within one account the DESIGN.md order
    holds exactly (highest Priority first, then oldest due, within what can
    be sent); across accounts the batch is shared, because each account
    sends over its own connection and budget.  With one account (the common
    case) the batch is exactly the global order.
 3. Charge the budgets, close the attempts of reclaimed leases (Abandoned),
    open one attempt per claimed mail; commit; return the mails.
Expected plan of a pass (header of IX_MailQueue_ClaimByAccount): Table Scan
of @Acct (a few rows) -> Nested Loops -> per account Top (Cap) <- Sequence
Project <- ordered Index Seek on IX_MailQueue_ClaimByAccount (ten ranges:
AccountName = a, Priority = p, VisibleAtUtc <= @Now; residual AppName,
AttemptsRemaining, ExpiresAtUtc); above the loop a TopN Sort of at most
(slots + accounts) rows by Turn; Clustered Index Seek by ID for the UPDATE
(Clustered Index Update maintains the indexes).  No scan of mailq.MailQueue,
no Sort below a per-account Top, nothing that reads a non-driving account.
Bounds per pass statement: rows read (and U-locked) on
IX_MailQueue_ClaimByAccount <= max(slots left, accounts open) <= @BatchSize;
at most @BatchSize rows updated, each also taking the key lock of its new
position in the index: <= 2 x @BatchSize key locks on the index, <=
@BatchSize on the clustered index (2,000 at the largest batch, 100 at the
worker's default of 50), never near the 5,000 locks per statement and index
that trigger lock escalation (Microsoft, "Lock escalation": the threshold
counts one statement's locks on one index or table).  Limits: an isolated worker (@AppName) reads past
due mail of OTHER applications on the same account, and every claim reads
past expired / out-of-attempts mail not yet finalized; both are residual
predicates on the seek (covered by INCLUDE, no lookup).

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
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails in distributed transactions,
             error 627).  An error rolls back what it opened; inside a
             caller's transaction XACT_ABORT dooms that transaction and the
             caller must roll it back.  The result sets are read after the
             claim's statements (the rows are leased to @LockToken).
Isolation:   sets READ COMMITTED itself (READPAST is refused under
             SERIALIZABLE and SNAPSHOT, error 650, and REPEATABLE READ would
             keep every lock it reads; a level set inside a procedure
             reverts when it returns).  Under READ_COMMITTED_SNAPSHOT the claim's reads still
             lock: UPDLOCK makes them locking reads of the latest committed
             rows (Microsoft's "Table hints": UPDLOCK, READPAST).
Lock order:  mailq.SendingAccount (read, no lock held), mailq.RateBudget (U),
             mailq.MailQueue (U -> X), mailq.MailAttempt (X): the order of
             every mail-queue procedure that touches several of them.
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
    -- READPAST needs READ COMMITTED (error 650 under SERIALIZABLE / SNAPSHOT);
    -- the caller's level comes back when the procedure returns.
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

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

    -- Separate statements, not one OR: the order in which SQL Server
    -- evaluates ISJSON() and OPENJSON in one predicate is not guaranteed.
    DECLARE @AccountsOk BIT = 1;
    IF @AccountNames IS NOT NULL
    BEGIN
        IF ISJSON(@AccountNames) = 0 OR LEFT(LTRIM(@AccountNames), 1) <> N'['
            SET @AccountsOk = 0;
        ELSE IF EXISTS (SELECT 1 FROM OPENJSON(@AccountNames) AS j WHERE j.[type] <> 1)
            SET @AccountsOk = 0;
    END;
    IF @AccountsOk = 0
        THROW 50148, N'@AccountNames must be a JSON array of account names, e.g. ["default", "overseas"].', 1;

    DECLARE @Served TABLE (AccountName NVARCHAR(128) NOT NULL PRIMARY KEY);
    IF @AccountNames IS NOT NULL
        INSERT INTO @Served (AccountName)
        SELECT DISTINCT CAST(j.[value] AS NVARCHAR(128))
        FROM OPENJSON(@AccountNames) AS j
        WHERE LEN(j.[value]) <= 128;  -- a longer name is no account (never truncated into one)

    DECLARE @Now DATETIME2(3);
    DECLARE @LeaseUntil DATETIME2(3);
    DECLARE @MinuteStart DATETIME2(0);
    DECLARE @HourStart DATETIME2(0);
    DECLARE @DayStart DATETIME2(0);

    -- The accounts that drive the claim.  Remaining: what the account may
    -- still take in this claim; Taken: claimed so far; Cap: this pass's
    -- per-account TOP; IsOpen: may take more in a later pass.
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
        Taken INT NOT NULL DEFAULT (0),
        Cap INT NOT NULL DEFAULT (0),
        IsOpen BIT NOT NULL DEFAULT (1)
    );
    DECLARE @Claimed TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AccountName NVARCHAR(128) NOT NULL,
        OldStatus NVARCHAR(16) NOT NULL,
        OldLockToken UNIQUEIDENTIFIER NULL,
        AttemptNo INT NOT NULL,
        Pass INT NOT NULL
    );
    DECLARE @Pass INT = 0;
    DECLARE @Left INT = @BatchSize;
    DECLARE @Open INT;
    DECLARE @Share INT;

    -- 2. Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        -- Accounts without limits: no budget to take, so no lock either.
        -- A plain read: under READ_COMMITTED_SNAPSHOT it sees the last
        -- committed BlockedUntilUtc, which is all a claim needs.
        INSERT INTO @Acct (AccountName, IsLimited, BlockedUntilUtc)
        SELECT a.AccountName, 0, a.BlockedUntilUtc
        FROM mailq.SendingAccount AS a
        WHERE
            a.PerMinuteLimit IS NULL AND a.PerHourLimit IS NULL AND a.PerDayLimit IS NULL
            AND (@AccountNames IS NULL OR a.AccountName IN (SELECT s.AccountName FROM @Served AS s));

        -- Accounts with limits, and their budget rows.
        -- UPDLOCK:  the budget row stays ours until commit, so two claimers
        --           cannot both spend the same remainder (a locking read also
        --           under READ_COMMITTED_SNAPSHOT);
        -- READPAST: a budget row held by another claimer is skipped (that
        --           account's mail waits for the next claim), never waited on;
        -- ROWLOCK:  row grain, so READPAST skips one account, not a page;
        -- FORCESEEK: one seek on PK_RateBudget per account read above, never
        --           a scan: a scan U-locks (and keeps) the budget row of
        --           every account, also those this worker does not serve or
        --           that have no limit, so claimers serving other accounts
        --           would read past them and skip accounts no one is using.
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

        -- The clock, read while the budget rows are held: every claimer of an
        -- account reads it under the same lock, one after the other.
        SET @Now = SYSUTCDATETIME();
        SET @LeaseUntil = DATEADD(SECOND, @LeaseSeconds, @Now);
        SET @MinuteStart = DATEADD(MINUTE, DATEDIFF(MINUTE, '20000101', @Now), '20000101');
        SET @HourStart = DATEADD(HOUR, DATEDIFF(HOUR, '20000101', @Now), '20000101');
        SET @DayStart = CAST(CAST(@Now AS DATE) AS DATETIME2(0));

        DELETE FROM @Acct WHERE BlockedUntilUtc > @Now;

        -- Windows never move backwards: a stored window that starts at or
        -- after ours is the current one and its count applies (a clock read
        -- earlier, or a clock set back, cannot reopen a spent window).
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

        -- More accounts than slots: keep the accounts that have claimable
        -- mail now (one row-free probe per account on the same index), then
        -- @BatchSize of them drawn at random per claim, so every account gets
        -- its turn and a pass never seeks more than @BatchSize accounts.
        --   READPAST, READCOMMITTEDLOCK: a locking read that skips rows other
        --   claimers hold (an account whose claimable rows are all held has
        --   nothing for us) and takes no lock it keeps; also under RCSI.
        IF (SELECT COUNT(*) FROM @Acct) > @BatchSize
        BEGIN
            DELETE FROM d
            FROM @Acct AS d
            WHERE NOT EXISTS (
                SELECT 1
                FROM mailq.MailQueue AS k WITH (
                    INDEX (IX_MailQueue_ClaimByAccount), FORCESEEK, READPAST, READCOMMITTEDLOCK
                )
                WHERE
                    k.AccountName = d.AccountName
                    AND k.Status IN (N'UnSent', N'Sending')
                    AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                    AND k.VisibleAtUtc <= @Now
                    AND k.AttemptsRemaining > 0
                    AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                    AND (@AppName IS NULL OR k.AppName = @AppName)
            );
            IF (SELECT COUNT(*) FROM @Acct) > @BatchSize
                DELETE FROM d
                FROM @Acct AS d
                WHERE d.AccountName NOT IN (
                    SELECT TOP (@BatchSize) r.AccountName FROM @Acct AS r ORDER BY NEWID()
                );
        END;

        -- 3. The claim: up to three passes, one UPDATE each (see the header).
        WHILE @Pass < 3 AND @Left > 0
        BEGIN
            SET @Pass += 1;
            SELECT @Open = COUNT(*) FROM @Acct WHERE IsOpen = 1 AND Remaining > Taken;
            IF @Open = 0 BREAK;
            -- FLOOR, at least 1: the caps never add up to more than the slots
            -- left (or one row per open account), which bounds the rows read.
            SET @Share = IIF(@Left / @Open < 1, 1, @Left / @Open);
            UPDATE @Acct
            SET Cap = IIF(
                IsOpen = 1 AND Remaining > Taken,
                IIF(Remaining - Taken < @Share, Remaining - Taken, @Share),
                0
            );

            UPDATE q
            SET
                q.Status = N'Sending',
                q.ThreadLock = @LockToken,
                q.VisibleAtUtc = @LeaseUntil,
                q.AttemptsRemaining = q.AttemptsRemaining - 1,
                q.AttemptCount = q.AttemptCount + 1,
                -- A lease that expired may hide a mail the dead worker already
                -- handed to SMTP: flag it (receivers can drop it by Message-ID).
                q.PossibleDuplicate = IIF(q.Status = N'Sending', CAST(1 AS BIT), q.PossibleDuplicate)
            OUTPUT
                inserted.ID,
                inserted.AccountName,
                deleted.Status,
                deleted.ThreadLock,
                inserted.AttemptCount,
                @Pass
            INTO @Claimed (ID, AccountName, OldStatus, OldLockToken, AttemptNo, Pass)
            -- Target row by its clustered key.  READPAST: a row another
            -- session holds (e.g. an acknowledgement of an expired lease in
            -- flight) is skipped instead of waited on, which also rules out a
            -- deadlock between our index-key U lock and its clustered X lock.
            FROM mailq.MailQueue AS q WITH (READPAST, UPDLOCK, ROWLOCK)
            INNER JOIN (
                SELECT TOP (@Left) c.ID
                FROM @Acct AS a
                CROSS APPLY (
                    -- One ordered seek per account (ten ranges, one per
                    -- priority, already in ORDER BY order: no Sort, the TOP
                    -- stops it after Cap rows).
                    --   INDEX + FORCESEEK: the plan of the index's header,
                    --     never a scan, whatever the statistics say;
                    --   READPAST: skip rows other workers hold, never wait;
                    --   UPDLOCK:  claim while reading, so two workers can't
                    --     take one row (and a locking read under RCSI);
                    --   ROWLOCK:  row grain, so READPAST skips rows, not pages.
                    SELECT TOP (a.Cap)
                        k.ID,
                        k.Priority,
                        k.VisibleAtUtc,
                        ROW_NUMBER() OVER (ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC) AS Turn
                    FROM mailq.MailQueue AS k WITH (
                        INDEX (IX_MailQueue_ClaimByAccount), FORCESEEK, READPAST, UPDLOCK, ROWLOCK
                    )
                    WHERE
                        k.AccountName = a.AccountName
                        AND k.Status IN (N'UnSent', N'Sending')
                        AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                        AND k.VisibleAtUtc <= @Now
                        AND k.AttemptsRemaining > 0
                        AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                        AND (@AppName IS NULL OR k.AppName = @AppName)
                    ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC
                ) AS c
                WHERE a.Cap > 0
                ORDER BY c.Turn ASC, c.Priority DESC, c.VisibleAtUtc ASC, c.ID ASC
            ) AS p ON q.ID = p.ID
            WHERE
                q.Status IN (N'UnSent', N'Sending')
                AND q.VisibleAtUtc <= @Now
                AND q.AttemptsRemaining > 0;

            -- What this pass gave each account; an account that yielded fewer
            -- rows than its cap has nothing more to claim now (drained).
            UPDATE a
            SET
                a.Taken = a.Taken + COALESCE(n.Claimed, 0),
                a.IsOpen = IIF(COALESCE(n.Claimed, 0) < a.Cap, 0, a.IsOpen)
            FROM @Acct AS a
            LEFT JOIN (
                SELECT m.AccountName, COUNT(*) AS Claimed
                FROM @Claimed AS m
                WHERE m.Pass = @Pass
                GROUP BY m.AccountName
            ) AS n ON a.AccountName = n.AccountName
            WHERE a.Cap > 0;

            SET @Left = @BatchSize - (SELECT COUNT(*) FROM @Claimed);
        END;

        -- Charge the budget of limited accounts (rows already U-locked above).
        -- FORCESEEK, ROWLOCK: touch only those rows; a scan would wait on the
        -- budget rows other claimers hold.  A stored window that is not older
        -- than ours is kept: the window start never moves backwards.
        UPDATE b
        SET
            b.MinuteCount = IIF(b.MinuteStartUtc >= @MinuteStart, b.MinuteCount, 0) + a.Taken,
            b.MinuteStartUtc = IIF(b.MinuteStartUtc >= @MinuteStart, b.MinuteStartUtc, @MinuteStart),
            b.HourCount = IIF(b.HourStartUtc >= @HourStart, b.HourCount, 0) + a.Taken,
            b.HourStartUtc = IIF(b.HourStartUtc >= @HourStart, b.HourStartUtc, @HourStart),
            b.DayCount = IIF(b.DayStartUtc >= @DayStart, b.DayCount, 0) + a.Taken,
            b.DayStartUtc = IIF(b.DayStartUtc >= @DayStart, b.DayStartUtc, @DayStart)
        FROM mailq.RateBudget AS b WITH (FORCESEEK, ROWLOCK)
        INNER JOIN @Acct AS a ON b.AccountName = a.AccountName
        WHERE a.IsLimited = 1 AND a.Taken > 0;

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
        FROM @Claimed AS c;

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened; a caller's transaction is doomed by
        -- XACT_ABORT and its own CATCH rolls it back.
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    -- 4. Return the leased mails (ours until LeaseExpiresUtc; no lock needed).
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
    WHERE q.ThreadLock = @LockToken
    ORDER BY q.Priority DESC, q.ID ASC;

    SELECT
        a.MailID,
        a.AttachmentNo,
        a.FileName,
        a.ContentType,
        a.Content
    FROM mailq.MailAttachment AS a
    INNER JOIN @Claimed AS c ON a.MailID = c.ID
    ORDER BY a.MailID ASC, a.AttachmentNo ASC;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.EnqueueMail: validates one mail and queues it; with an idempotency key
that is already queued it returns the existing mail and inserts nothing.
Parameters:  @ToAddress   NVARCHAR(MAX), required: ';'-separated entries, each
                          an address or 'Display Name <address>'
             @Subject     NVARCHAR(MAX), required (N'' for none), <= 900 chars
             @Body        NVARCHAR(MAX), required, <= 2,000,000 chars
             @BodyFormat  N'Text' (default) or N'Html'
             @TextBody    plain-text alternative of an Html body, <= 2,000,000 chars
             @CC, @BCC    ';'-separated addresses; BCC is never sent as a header
             @FromAddress default: the account's DefaultFromAddress
             @FromName    default: the account's DefaultFromName, <= 200 chars
             @ReplyTo     one address
             @Headers     business headers: a JSON object of string values,
                          e.g. N'{"X-Order-Id": "42"}'; at most 50
             @AccountName default: the default sending account
             @AppName     a registered application (mailq.UpsertApplication)
             @Priority    0-9, 9 first, default 5
             @DateToProcess  UTC time to send at, default now
             @ExpiresAtUtc   UTC time after which the mail is Expired unsent
             @MaxAttempts    1-20, default 5
             @IdempotencyKey <= 200 chars; see "Idempotency" below
             @Attachments    JSON array of {"FileName", "ContentType",
                          "ContentBase64"}; <= 10 files, 10 MiB each, 25 MiB in all
             NULL for an optional parameter means its default.
Outputs:     @MailID BIGINT, @MessageID NVARCHAR(255) (RFC 5322 Message-ID,
             sent unchanged by every attempt), @Created BIT (0 when an existing
             mail was returned for the idempotency key).  No result set, so the
             procedure can be called from triggers.
Idempotency: the key is global and compared as binary text (case- and
             accent-sensitive: 'ABC' and 'abc' are two keys), the rule of the
             column (COLLATE Latin1_General_100_BIN2) and of sp_getapplock's
             resource names alike; trailing spaces are ignored, as by every
             SQL Server comparison.  The same key with the same content (the
             parameters exactly as passed, attachments included) returns the
             first mail; with different content it raises 50116 and writes
             nothing.  A key is free again once PurgeMail deleted its mail.
             Concurrent calls with one key serialize on an application lock
             on that key (no key-range locks: neighbouring keys never wait);
             the lock is owned by the transaction, so inside a caller's
             transaction a second call with the SAME key waits until the
             caller commits or rolls back (at most 10 s, then 50162).
Binding:     with @AppName, the account must be bound to the application and
             the From address must match one of its From bindings (an exact
             address or '@domain'); see mailq.BindApplication.  Mail without
             @AppName is bound only when the calling database user is mapped
             to an application (mailq.ApplicationPrincipal): its mail then
             always carries that application (@AppName NULL means it, another
             is 50168).  Unmapped users without @AppName are not bound
             (docs/guarantees.md, "Who may send as whom").
Errors:      50101 no recipient in @ToAddress; 50102 an invalid address;
             50103 a value over its size; 50104 more than 100 recipients;
             50105 CR or LF in a header value (header injection);
             50106 @Headers not a JSON object of string values;
             50107 invalid header name; 50108 header would override a reserved one;
             50109 @Priority not 0-9; 50110 @ExpiresAtUtc not after the due time;
             50111 body over its limit; 50112 attachment count or size over limit;
             50113 attachment file name empty or path-like;
             50114 unknown (or no default) account; 50115 unknown application;
             50116 idempotency key reused with different content;
             50117 @Attachments malformed; 50118 @BodyFormat not Text or Html;
             50119 @MaxAttempts not 1-20; 50120 @Body missing; 50121 @Subject missing;
             50160 the application may not send through @AccountName;
             50161 the application may not send as @FromAddress;
             50162 the idempotency key's lock was not granted in 10 s (or deadlock);
             50168 the calling database user is mapped to another application.
Transaction: opens its own if none is open, else works inside the caller's
             (the outbox pattern: the mail exists exactly when the caller
             commits; no savepoint, SAVE TRANSACTION fails under MSDTC with
             error 627).  Any error, validation included, is re-raised
             unchanged; XACT_ABORT ON rolls back the caller's transaction, or
             dooms it (XACT_STATE() = -1) when the caller catches the error:
             the caller can only roll back, and nothing of this call remains.
Isolation:   sets READ COMMITTED itself (a level set in a procedure reverts when
             it returns): under a SERIALIZABLE caller the key lookup would
             otherwise take key-range locks, under SNAPSHOT it would miss a
             key committed after the caller's snapshot began.
Lock order:  the application lock on the key, then mailq.MailQueue (insert),
             then mailq.MailAttachment (docs/guarantees.md, "Lock order").
Example:     DECLARE @ID BIGINT;
             EXEC mailq.EnqueueMail @ToAddress = N'ops@example.com',
                 @Subject = N'Nightly report', @Body = N'All jobs succeeded.',
                 @MailID = @ID OUTPUT;
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMail
    @ToAddress NVARCHAR(MAX),
    @Subject NVARCHAR(MAX),
    @Body NVARCHAR(MAX),
    @BodyFormat NVARCHAR(20) = N'Text',
    @TextBody NVARCHAR(MAX) = NULL,
    @CC NVARCHAR(MAX) = NULL,
    @BCC NVARCHAR(MAX) = NULL,
    @FromAddress NVARCHAR(MAX) = NULL,
    @FromName NVARCHAR(MAX) = NULL,
    @ReplyTo NVARCHAR(MAX) = NULL,
    @Headers NVARCHAR(MAX) = NULL,
    @AccountName NVARCHAR(4000) = NULL,
    @AppName NVARCHAR(4000) = NULL,
    @Priority INT = 5,
    @DateToProcess DATETIME2(3) = NULL,
    @ExpiresAtUtc DATETIME2(3) = NULL,
    @MaxAttempts INT = 5,
    @IdempotencyKey NVARCHAR(4000) = NULL,
    @Attachments NVARCHAR(MAX) = NULL,
    @MailID BIGINT = NULL OUTPUT,
    @MessageID NVARCHAR(255) = NULL OUTPUT,
    @Created BIT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Msg NVARCHAR(2048);
    -- Tested under a binary collation (COLLATE Latin1_General_100_BIN2): under
    -- a linguistic collation control characters can be ignorable in LIKE.
    DECLARE @CrLf NVARCHAR(10) = N'%[' + NCHAR(13) + NCHAR(10) + N']%';

    -- The content hash covers the parameters exactly as passed (before
    -- defaults), so that the same call is recognised as the same mail.
    DECLARE @ContentJson NVARCHAR(MAX) = (
        SELECT
            @ToAddress AS ToAddress, @CC AS CC, @BCC AS BCC, @Subject AS Subject,
            @Body AS Body, @BodyFormat AS BodyFormat, @TextBody AS TextBody,
            @FromAddress AS FromAddress, @FromName AS FromName, @ReplyTo AS ReplyTo,
            @Headers AS Headers, @AccountName AS AccountName, @AppName AS AppName,
            @Priority AS Priority, @DateToProcess AS DateToProcess,
            @ExpiresAtUtc AS ExpiresAtUtc, @MaxAttempts AS MaxAttempts,
            @Attachments AS Attachments
        FOR JSON PATH, WITHOUT_ARRAY_WRAPPER, INCLUDE_NULL_VALUES
    );

    SET @BodyFormat = COALESCE(@BodyFormat, N'Text');
    SET @Priority = COALESCE(@Priority, 5);
    SET @MaxAttempts = COALESCE(@MaxAttempts, 5);
    SET @DateToProcess = COALESCE(@DateToProcess, @Now);

    -- 1. Validate parameters before any transaction starts.
    IF @ToAddress IS NULL OR NOT EXISTS (SELECT 1 FROM mailq.ParseAddressList(@ToAddress))
        THROW 50101, N'@ToAddress is required: give at least one recipient address (separate several with ;).', 1;
    IF @Subject IS NULL
        THROW 50121, N'@Subject is required (pass N'''' for a mail without subject).', 1;
    IF @Body IS NULL
        THROW 50120, N'@Body is required.', 1;

    SELECT TOP (1)
        @Msg = CONCAT(v.ParamName, N' is ', LEN(v.Value), N' characters long; the limit is ', v.MaxLength, N'.')
    FROM (
        VALUES
        (1, N'@ToAddress', @ToAddress, 4000), (2, N'@CC', @CC, 4000), (3, N'@BCC', @BCC, 4000),
        (4, N'@Subject', @Subject, 900), (5, N'@FromAddress', @FromAddress, 320),
        (6, N'@FromName', @FromName, 200), (7, N'@ReplyTo', @ReplyTo, 320),
        (8, N'@AccountName', @AccountName, 128), (9, N'@AppName', @AppName, 128),
        (10, N'@IdempotencyKey', @IdempotencyKey, 200)
    ) AS v(Position, ParamName, Value, MaxLength)
    WHERE LEN(v.Value) > v.MaxLength
    ORDER BY v.Position;
    IF @Msg IS NOT NULL THROW 50103, @Msg, 1;

    SELECT TOP (1)
        @Msg = CONCAT(v.ParamName, N' contains CR or LF; header values must be one line (header injection is refused).')
    FROM (
        VALUES
        (1, N'@Subject', @Subject), (2, N'@FromName', @FromName), (3, N'@ReplyTo', @ReplyTo),
        (4, N'@FromAddress', @FromAddress), (5, N'@IdempotencyKey', @IdempotencyKey)
    ) AS v(Position, ParamName, Value)
    WHERE v.Value COLLATE Latin1_General_100_BIN2 LIKE @CrLf
    ORDER BY v.Position;
    IF @Msg IS NOT NULL THROW 50105, @Msg, 1;

    SELECT TOP (1)
        @Msg = CONCAT(
            v.ParamName, N': address ''', LEFT(a.Address, 100), N''' ', a.Problem, N'.'
        )
    FROM (
        VALUES
        (1, N'@ToAddress', @ToAddress), (2, N'@CC', @CC), (3, N'@BCC', @BCC),
        (4, N'@ReplyTo', @ReplyTo), (5, N'@FromAddress', @FromAddress)
    ) AS v(Position, ParamName, Value)
    CROSS APPLY mailq.ParseAddressList(v.Value) AS a
    WHERE a.Problem IS NOT NULL
    ORDER BY v.Position;
    IF @Msg IS NOT NULL THROW 50102, @Msg, 1;

    IF (SELECT COUNT(*) FROM mailq.ParseAddressList(@ReplyTo)) > 1
        THROW 50102, N'@ReplyTo takes one address.', 1;
    IF (SELECT COUNT(*) FROM mailq.ParseAddressList(@FromAddress)) > 1
        THROW 50102, N'@FromAddress takes one address.', 1;
    IF EXISTS (SELECT 1 FROM mailq.ParseAddressList(@FromAddress) AS a WHERE a.DisplayName IS NOT NULL)
        THROW 50102, N'@FromAddress takes a bare address; give the display name in @FromName.', 1;

    DECLARE @RecipientCount INT = (
        SELECT COUNT(*)
        FROM (VALUES (@ToAddress), (@CC), (@BCC)) AS v(Value)
        CROSS APPLY mailq.ParseAddressList(v.Value)
    );
    IF @RecipientCount > 100
    BEGIN
        SET @Msg = CONCAT(N'@ToAddress, @CC and @BCC name ', @RecipientCount, N' recipients; the limit is 100.');
        THROW 50104, @Msg, 1;
    END;

    IF @BodyFormat NOT IN (N'Text', N'Html')
    BEGIN
        SET @Msg = CONCAT(N'@BodyFormat must be Text or Html; got ''', LEFT(@BodyFormat, 20), N'''.');
        THROW 50118, @Msg, 1;
    END;
    IF @Priority NOT BETWEEN 0 AND 9
    BEGIN
        SET @Msg = CONCAT(N'@Priority must be 0-9 (9 is sent first); got ', @Priority, N'.');
        THROW 50109, @Msg, 1;
    END;
    IF @MaxAttempts NOT BETWEEN 1 AND 20
    BEGIN
        SET @Msg = CONCAT(N'@MaxAttempts must be 1-20; got ', @MaxAttempts, N'.');
        THROW 50119, @Msg, 1;
    END;
    IF @ExpiresAtUtc <= @DateToProcess
    BEGIN
        SET @Msg = CONCAT(
            N'@ExpiresAtUtc (', CONVERT(NVARCHAR(30), @ExpiresAtUtc, 126),
            N') must be later than the due time (', CONVERT(NVARCHAR(30), @DateToProcess, 126), N').'
        );
        THROW 50110, @Msg, 1;
    END;
    IF LEN(@Body) > 2000000 OR LEN(@TextBody) > 2000000
        THROW 50111, N'@Body and @TextBody are limited to 2,000,000 characters each.', 1;

    -- Business headers: a JSON object whose values are strings.
    IF @Headers IS NOT NULL
    BEGIN
        IF ISJSON(@Headers) = 0 OR LEFT(LTRIM(@Headers), 1) <> N'{'
            THROW 50106, N'@Headers must be a JSON object of string values, e.g. {"X-Order-Id": "42"}.', 1;

        SELECT TOP (1) @Msg = CONCAT(N'@Headers: the value of ''', LEFT(j.[key], 80), N''' must be a JSON string.')
        FROM OPENJSON(@Headers) AS j
        WHERE j.[type] <> 1;
        IF @Msg IS NOT NULL THROW 50106, @Msg, 1;

        IF (SELECT COUNT(*) FROM OPENJSON(@Headers)) > 50
            THROW 50106, N'@Headers holds more than 50 headers.', 1;

        IF EXISTS (
            SELECT UPPER(j.[key]) AS HeaderName
            FROM OPENJSON(@Headers) AS j
            GROUP BY UPPER(j.[key])
            HAVING COUNT(*) > 1
        )
            THROW 50106, N'@Headers names one header twice.', 1;

        -- RFC 5322 field name: 1-76 printable US-ASCII characters except ':'
        -- (the binary collation makes the ranges code-point ranges).
        SELECT TOP (1) @Msg = CONCAT(
            N'@Headers: ''', LEFT(j.[key], 80), N''' is not a valid header name ',
            N'(1-76 printable ASCII characters, no space or colon).'
        )
        FROM OPENJSON(@Headers) AS j
        WHERE
            LEN(j.[key]) NOT BETWEEN 1 AND 76
            OR j.[key] COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-9;-~]%';
        IF @Msg IS NOT NULL THROW 50107, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(N'@Headers: ''', j.[key], N''' is set by mailq-db and cannot be overridden.')
        FROM OPENJSON(@Headers) AS j
        WHERE UPPER(j.[key]) IN (
            N'FROM', N'TO', N'CC', N'BCC', N'SUBJECT', N'MESSAGE-ID', N'DATE', N'REPLY-TO',
            N'SENDER', N'RETURN-PATH', N'MIME-VERSION', N'CONTENT-TYPE',
            N'CONTENT-TRANSFER-ENCODING', N'CONTENT-DISPOSITION'
        );
        IF @Msg IS NOT NULL THROW 50108, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(
            N'@Headers: the value of ''', j.[key], N''' contains CR or LF (header injection is refused).'
        )
        FROM OPENJSON(@Headers) AS j
        WHERE j.[value] COLLATE Latin1_General_100_BIN2 LIKE @CrLf;
        IF @Msg IS NOT NULL THROW 50105, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(N'@Headers: the value of ''', j.[key], N''' is longer than 900 characters.')
        FROM OPENJSON(@Headers) AS j
        WHERE LEN(j.[value]) > 900;
        IF @Msg IS NOT NULL THROW 50103, @Msg, 1;
    END;

    -- The calling database user's application, when an administrator mapped
    -- it (mailq.BindApplication @PrincipalName): USER_NAME() is the caller's
    -- user (this module has no EXECUTE AS).  The content hash above keeps
    -- @AppName as passed.
    DECLARE @PrincipalApp NVARCHAR(128) = (
        SELECT u.AppName FROM mailq.ApplicationPrincipal AS u WHERE u.PrincipalName = USER_NAME()
    );
    IF @PrincipalApp IS NOT NULL
    BEGIN
        IF @AppName IS NOT NULL AND @AppName <> @PrincipalApp
        BEGIN
            SET @Msg = CONCAT(
                N'Database user ', QUOTENAME(USER_NAME()), N' enqueues as application ''', @PrincipalApp,
                N''' only; got @AppName ''', @AppName, N'''.'
            );
            THROW 50168, @Msg, 1;
        END;
        SET @AppName = @PrincipalApp;
    END;

    -- Account and application.
    DECLARE @ResolvedAccount NVARCHAR(128), @DefaultFrom NVARCHAR(320), @DefaultFromName NVARCHAR(200);
    SELECT
        @ResolvedAccount = a.AccountName,
        @DefaultFrom = a.DefaultFromAddress,
        @DefaultFromName = a.DefaultFromName
    FROM mailq.SendingAccount AS a
    WHERE
        (@AccountName IS NOT NULL AND a.AccountName = @AccountName)
        OR (@AccountName IS NULL AND a.IsDefault = 1);
    IF @ResolvedAccount IS NULL
    BEGIN
        SET @Msg = IIF(
            @AccountName IS NULL,
            N'@AccountName is NULL and no default sending account exists (mailq.UpsertSendingAccount @IsDefault = 1).',
            CONCAT(N'@AccountName ''', @AccountName, N''' is not a sending account (mailq.UpsertSendingAccount).')
        );
        THROW 50114, @Msg, 1;
    END;
    IF @AppName IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(N'@AppName ''', @AppName, N''' is not a registered application (mailq.UpsertApplication).');
        THROW 50115, @Msg, 1;
    END;

    SET @FromAddress = LTRIM(RTRIM(COALESCE(@FromAddress, @DefaultFrom)));
    SET @FromName = COALESCE(@FromName, @DefaultFromName);

    -- Who may send as whom (issue 10, point 10): an application sends only
    -- through the accounts and as the From addresses or domains it is bound to.
    IF @AppName IS NOT NULL
    BEGIN
        IF NOT EXISTS (
            SELECT 1
            FROM mailq.ApplicationAccount AS b
            WHERE b.AppName = @AppName AND b.AccountName = @ResolvedAccount
        )
        BEGIN
            SET @Msg = CONCAT(
                N'Application ''', @AppName, N''' may not send through account ''', @ResolvedAccount,
                N''' (an administrator binds it: mailq.BindApplication @AppName, @AccountName).'
            );
            THROW 50160, @Msg, 1;
        END;
        -- Addresses and domains compare case-insensitively whatever the
        -- database collation (LOWER on both sides, then binary).
        DECLARE @FromLower NVARCHAR(320) = LOWER(@FromAddress) COLLATE Latin1_General_100_BIN2;
        IF NOT EXISTS (
            SELECT 1
            FROM mailq.ApplicationFrom AS f
            WHERE
                f.AppName = @AppName
                AND (
                    f.FromPattern = @FromLower
                    OR (
                        LEFT(f.FromPattern, 1) = N'@'
                        AND RIGHT(@FromLower, LEN(f.FromPattern)) = f.FromPattern
                    )
                )
        )
        BEGIN
            SET @Msg = CONCAT(
                N'Application ''', @AppName, N''' may not send as ''', @FromAddress,
                N''' (an administrator binds it: mailq.BindApplication @AppName, ',
                N'@FromAddress = N''addr'' or N''@domain'').'
            );
            THROW 50161, @Msg, 1;
        END;
    END;

    -- Attachments: decoded from base64 by OPENJSON ... WITH (VARBINARY), which
    -- raises an error for text that is not base64: caught and reported as 50117.
    DECLARE @Attachment TABLE (
        AttachmentNo INT NOT NULL PRIMARY KEY,
        FileName NVARCHAR(4000) NULL,
        ContentType NVARCHAR(4000) NULL,
        Content VARBINARY(MAX) NULL
    );
    IF @Attachments IS NOT NULL
    BEGIN
        IF ISJSON(@Attachments) = 0 OR LEFT(LTRIM(@Attachments), 1) <> N'['
            THROW 50117,
                N'@Attachments must be a JSON array of {"FileName", "ContentType", "ContentBase64"} objects.',
                1;
        IF EXISTS (SELECT 1 FROM OPENJSON(@Attachments) AS e WHERE e.[type] <> 5)
            THROW 50117, N'@Attachments: every element must be an object with FileName and ContentBase64.', 1;
        BEGIN TRY
            INSERT INTO @Attachment (AttachmentNo, FileName, ContentType, Content)
            SELECT
                CAST(e.[key] AS INT) + 1 AS AttachmentNo,
                f.FileName,
                f.ContentType,
                f.Content
            FROM OPENJSON(@Attachments) AS e
            CROSS APPLY OPENJSON (e.[value])
                WITH (
                    FileName NVARCHAR(4000) '$.FileName',
                    ContentType NVARCHAR(4000) '$.ContentType',
                    Content VARBINARY(MAX) '$.ContentBase64'
                ) AS f;
        END TRY
        BEGIN CATCH
            SET @Msg = CONCAT(N'@Attachments: ContentBase64 must be base64 text (', ERROR_MESSAGE(), N').');
            THROW 50117, @Msg, 1;
        END CATCH;

        IF EXISTS (SELECT 1 FROM @Attachment AS t WHERE t.Content IS NULL)
            THROW 50117, N'@Attachments: every element must be an object with FileName and ContentBase64.', 1;
        IF (SELECT COUNT(*) FROM @Attachment) > 10
            THROW 50112, N'@Attachments holds more than 10 attachments.', 1;

        SELECT TOP (1) @Msg = CONCAT(
            N'@Attachments: file name ''', LEFT(t.FileName, 100),
            N''' must be a bare file name (not empty, no path, no control characters, <= 255 characters).'
        )
        FROM @Attachment AS t
        WHERE
            NULLIF(LTRIM(RTRIM(t.FileName)), N'') IS NULL
            OR t.FileName LIKE N'%[/\:]%'
            OR t.FileName IN (N'.', N'..')
            OR t.FileName COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%'
            OR LEN(t.FileName) > 255
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50113, @Msg, 1;

        SELECT TOP (1)
            @Msg = CONCAT(N'@Attachments: content type of ''', t.FileName, N''' must look like type/subtype.')
        FROM @Attachment AS t
        WHERE
            t.ContentType IS NOT NULL
            AND (
                t.ContentType NOT LIKE N'_%/_%'
                OR t.ContentType COLLATE Latin1_General_100_BIN2 LIKE @CrLf
                OR LEN(t.ContentType) > 255
            )
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50117, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(
            N'@Attachments: ''', t.FileName, N''' is ', DATALENGTH(t.Content),
            N' bytes; the limit is 10485760 (10 MiB) per attachment.'
        )
        FROM @Attachment AS t
        WHERE DATALENGTH(t.Content) > 10485760
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50112, @Msg, 1;

        IF (SELECT SUM(CAST(DATALENGTH(t.Content) AS BIGINT)) FROM @Attachment AS t) > 26214400
            THROW 50112, N'@Attachments total more than 26214400 bytes (25 MiB) per mail.', 1;
    END;

    DECLARE @ContentHash VARBINARY(32) = HASHBYTES('SHA2_256', @ContentJson);
    DECLARE @Domain NVARCHAR(320) = SUBSTRING(@FromAddress, CHARINDEX(N'@', @FromAddress) + 1, 320);
    -- A Message-ID must be ASCII: a non-ASCII sender domain gets a neutral one.
    IF @Domain COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-~]%' SET @Domain = N'mailq-db.invalid';

    -- 2. Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    DECLARE @LockResult INT;
    DECLARE @KeyResource NVARCHAR(255) = CONCAT(N'mailq.IdempotencyKey:', RTRIM(@IdempotencyKey));
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        DECLARE @ExistingHash VARBINARY(32);
        SET @MailID = NULL;
        IF @IdempotencyKey IS NOT NULL
        BEGIN
            -- Serialize on the key itself, not on a range of the index: an
            -- exclusive application lock owned by the transaction (released at
            -- its commit or rollback, the caller's when we run inside it).
            -- Resource names are compared as binary, like the key column; the
            -- key is at most 200 characters, so the resource fits its 255.
            -- Insert-first catching 2601/2627 was rejected: under XACT_ABORT ON
            -- a duplicate-key error dooms the caller's transaction, so the
            -- outbox case could never return the existing mail (docs/guarantees.md).
            EXEC @LockResult = sys.sp_getapplock
                @Resource = @KeyResource,
                @LockMode = N'Exclusive',
                @LockOwner = N'Transaction',
                @LockTimeout = 10000;
            -- < 0: timed out (-1), cancelled (-2), deadlock victim (-3), call
            -- error (-999).  A deadlock on an application lock does not roll
            -- back the transaction (sp_getapplock, Remarks): this THROW does,
            -- or dooms the caller's (XACT_ABORT ON).
            IF @LockResult < 0
            BEGIN
                SET @Msg = CONCAT(
                    N'@IdempotencyKey ''', @IdempotencyKey, N''': another transaction enqueueing the same key ',
                    N'held it for 10 s (sp_getapplock returned ', @LockResult, N'); retry once it committed.'
                );
                THROW 50162, @Msg, 1;
            END;

            -- A plain read is exact here: only EnqueueMail writes keys, always
            -- under this lock, so a row with the key is committed or absent.
            -- "IS NOT NULL" repeats the index filter, so the filtered index matches.
            SELECT
                @MailID = q.ID,
                @MessageID = q.MessageID,
                @ExistingHash = q.ContentHash
            FROM mailq.MailQueue AS q
            WHERE q.IdempotencyKey = @IdempotencyKey AND q.IdempotencyKey IS NOT NULL;

            IF @MailID IS NOT NULL AND @ExistingHash <> @ContentHash
            BEGIN
                SET @Msg = CONCAT(
                    N'@IdempotencyKey ''', @IdempotencyKey, N''' already belongs to mail ', @MailID,
                    N' with different content; use a new key for a different mail.'
                );
                THROW 50116, @Msg, 1;
            END;
        END;

        IF @MailID IS NOT NULL
            SET @Created = 0;
        ELSE
        BEGIN
            SET @MessageID = CONCAT(N'<', LOWER(CONVERT(NCHAR(36), NEWID())), N'@', @Domain, N'>');

            INSERT INTO mailq.MailQueue (
                dtStamp, DateToProcess, VisibleAtUtc, FromName, FromAddress, ReplyTo,
                ToAddress, CC, BCC, Subject, Body, BodyFormat, TextBody, Headers,
                Status, AttemptsRemaining, Priority, AccountName, AppName,
                IdempotencyKey, ContentHash, MessageID, ExpiresAtUtc
            )
            VALUES (
                @Now, @DateToProcess, @DateToProcess, @FromName, @FromAddress, LTRIM(RTRIM(@ReplyTo)),
                @ToAddress, @CC, @BCC, @Subject, @Body, @BodyFormat, @TextBody, @Headers,
                N'UnSent', @MaxAttempts, @Priority, @ResolvedAccount, @AppName,
                @IdempotencyKey, @ContentHash, @MessageID, @ExpiresAtUtc
            );
            SET @MailID = SCOPE_IDENTITY();

            INSERT INTO mailq.MailAttachment (MailID, AttachmentNo, FileName, ContentType, Content)
            SELECT
                @MailID,
                t.AttachmentNo,
                LTRIM(RTRIM(t.FileName)),
                COALESCE(t.ContentType, N'application/octet-stream'),
                t.Content
            FROM @Attachment AS t;

            SET @Created = 1;
        END;

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (SELECT 1 FROM mailq.MailQueue AS q WHERE q.Status = N'Stopped')
BEGIN
    DECLARE @Stopped BIGINT = (SELECT COUNT_BIG(*) FROM mailq.MailQueue AS q WHERE q.Status = N'Stopped');
    DECLARE @Msg NVARCHAR(2048) = CONCAT(
        N'Downgrade below 0011 refused: mailq.MailQueue holds ', @Stopped,
        N' Stopped mail(s), a status revision 0009 does not know. Requeue (mailq.RequeueMail) or purge them, ',
        N'or map them to Failed by hand (docs/events.md, "Downgrade"), then run the downgrade again.'
    );
    THROW 50261, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (
    SELECT 1
    FROM sys.indexes AS i
    WHERE
        i.object_id = OBJECT_ID(N'mailq.MailQueue')
        AND i.name = N'IX_MailQueue_Final'
        AND i.filter_definition LIKE N'%Stopped%'
)
BEGIN
    DROP INDEX IX_MailQueue_Final ON mailq.MailQueue;
    EXEC sys.sp_executesql
        N'CREATE NONCLUSTERED INDEX IX_MailQueue_Final
          ON mailq.MailQueue (DateProcessed ASC, ID ASC)
          INCLUDE (Status, AccountName)
          WHERE Status IN (N''Sent'', N''Failed'', N''Cancelled'', N''Expired'');';
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (
    SELECT 1
    FROM sys.check_constraints AS c
    WHERE
        c.parent_object_id = OBJECT_ID(N'mailq.MailQueue')
        AND c.name = N'CK_MailQueue_Status'
        AND c.[definition] LIKE N'%Stopped%'
)
BEGIN
    ALTER TABLE mailq.MailQueue DROP CONSTRAINT CK_MailQueue_Status;
    ALTER TABLE mailq.MailQueue ADD CONSTRAINT CK_MailQueue_Status CHECK (
        Status IN (N'UnSent', N'Sending', N'Sent', N'Failed', N'Cancelled', N'Expired')
    );
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailEvent') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailEvent_MailID ON mailq.MailEvent;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailEvent') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailEvent_AppName ON mailq.MailEvent;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.MailEvent;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
IX_MailQueue_Final serves mailq.PurgeMail and the reporting of finished
mail: final statuses ordered by DateProcessed, so a purge batch is a range
seek on the oldest rows instead of a scan of the queue.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Final' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailQueue_Final
    ON mailq.MailQueue (DateProcessed ASC, ID ASC)
    INCLUDE (Status, AccountName)
    WHERE Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired');
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.MailQueue: one row per mail.  The article's column names are kept
(ID, dtStamp, DateToProcess, DateProcessed, FromName, FromAddress, ToAddress,
CC, BCC, Status, ThreadLock, AttemptsRemaining, Priority, Body) and corrected:
BIGINT ID, NVARCHAR text, UTC DATETIME2(3) times, errors in LastError (never in
Status).

Status: UnSent (queued) -> Sending (leased) -> Sent | Failed | Cancelled | Expired.

VisibleAtUtc is the one column the claim ranges over: it holds the due time
while the mail is UnSent and the lease expiry while it is Sending, so "due or
lease expired" is a single range on IX_MailQueue_Claim (an OR across two
columns cannot seek).  DateToProcess keeps the caller's requested due time.

ThreadLock    the lock token of the worker holding the lease (NULL otherwise);
              every acknowledgement is fenced by it.
AttemptCount  attempts started (claims that led to Sending); AttemptsRemaining
              is decremented at claim, so a mail that kills its worker cannot
              loop forever.  Wait and Release refund the attempt.
PossibleDuplicate  set when an expired lease is reclaimed: the first worker may
              have handed the mail to SMTP before dying.
ContentHash   SHA-256 of the enqueued content; an idempotency key reused with
              different content is refused (error 50116).
MessageID     RFC 5322 Message-ID made at enqueue, sent unchanged by every
              attempt so that receivers can drop duplicates.
IdempotencyKey compared as binary text (COLLATE Latin1_General_100_BIN2),
              like the sp_getapplock resource mailq.EnqueueMail locks on.
Body, TextBody, Headers  stored out of row (table option 'large value types
              out of row' = 1, revision 0007): the clustered row keeps a
              16-byte pointer, so claims and counts read narrow rows.
Revision 0007 changed an existing table in place
(sql/upgrades/mailq.0007.MailQueue.sql); this file shows the current shape.
*/
IF OBJECT_ID(N'mailq.MailQueue', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailQueue (
        ID BIGINT IDENTITY (1, 1) NOT NULL,
        dtStamp DATETIME2(3) NOT NULL CONSTRAINT DF_MailQueue_dtStamp DEFAULT (SYSUTCDATETIME()),
        DateToProcess DATETIME2(3) NOT NULL,
        DateProcessed DATETIME2(3) NULL,
        VisibleAtUtc DATETIME2(3) NOT NULL,
        FromName NVARCHAR(200) NULL,
        FromAddress NVARCHAR(320) NOT NULL,
        ReplyTo NVARCHAR(320) NULL,
        ToAddress NVARCHAR(4000) NOT NULL,
        CC NVARCHAR(4000) NULL,
        BCC NVARCHAR(4000) NULL,
        Subject NVARCHAR(900) NOT NULL,
        Body NVARCHAR(MAX) NOT NULL,
        BodyFormat NVARCHAR(8) NOT NULL CONSTRAINT DF_MailQueue_BodyFormat DEFAULT (N'Text'),
        TextBody NVARCHAR(MAX) NULL,
        Headers NVARCHAR(MAX) NULL,
        Status NVARCHAR(16) NOT NULL CONSTRAINT DF_MailQueue_Status DEFAULT (N'UnSent'),
        ThreadLock UNIQUEIDENTIFIER NULL,
        AttemptsRemaining INT NOT NULL,
        AttemptCount INT NOT NULL CONSTRAINT DF_MailQueue_AttemptCount DEFAULT (0),
        Priority TINYINT NOT NULL CONSTRAINT DF_MailQueue_Priority DEFAULT (5),
        AccountName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NULL,
        IdempotencyKey NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NULL,
        ContentHash VARBINARY(32) NOT NULL,
        MessageID NVARCHAR(255) NOT NULL,
        ExpiresAtUtc DATETIME2(3) NULL,
        SentAtUtc DATETIME2(3) NULL,
        LastError NVARCHAR(4000) NULL,
        PossibleDuplicate BIT NOT NULL CONSTRAINT DF_MailQueue_PossibleDuplicate DEFAULT (0),
        DryRun BIT NOT NULL CONSTRAINT DF_MailQueue_DryRun DEFAULT (0),
        CONSTRAINT PK_MailQueue PRIMARY KEY CLUSTERED (ID),
        CONSTRAINT FK_MailQueue_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName),
        CONSTRAINT FK_MailQueue_Application FOREIGN KEY (AppName)
        REFERENCES mailq.Application (AppName),
        CONSTRAINT CK_MailQueue_Status CHECK (
            Status IN (N'UnSent', N'Sending', N'Sent', N'Failed', N'Cancelled', N'Expired')
        ),
        CONSTRAINT CK_MailQueue_Lease CHECK (
            (Status = N'Sending' AND ThreadLock IS NOT NULL)
            OR (Status <> N'Sending' AND ThreadLock IS NULL)
        ),
        CONSTRAINT CK_MailQueue_Priority CHECK (Priority BETWEEN 0 AND 9),
        CONSTRAINT CK_MailQueue_BodyFormat CHECK (BodyFormat IN (N'Text', N'Html')),
        CONSTRAINT CK_MailQueue_Attempts CHECK (AttemptsRemaining >= 0 AND AttemptCount >= 0),
        CONSTRAINT CK_MailQueue_Headers CHECK (Headers IS NULL OR ISJSON(Headers) = 1),
        CONSTRAINT CK_MailQueue_Expiry CHECK (ExpiresAtUtc IS NULL OR ExpiresAtUtc > DateToProcess)
    );
    EXEC sys.sp_tableoption N'mailq.MailQueue', 'large value types out of row', 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0011';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0011 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0010' WHERE dbo.mailq_alembic_version.version_num = '0011';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0010 -> 0009

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0010')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0010; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Activation INT = (
    SELECT CAST(q.is_activation_enabled AS INT) FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ'));
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = @Activation;
IF @Activation = 1
    ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
delay.Reconcile: finds delayed tasks that can no longer fire, and platform rows
that never got a task, and repairs or reports them.  Run it after a database
copy or restore, after a bulk load into dbo.tabDIYTable12402, once after
migrating from the seed design (@ScheduleMissing = 1, the one-off backfill),
and from a SQL Server Agent job every few minutes (`mailq-db doctor` runs it
with @Apply = 0).
Parameters:  @Apply BIT = 1            0: report only, change nothing
             @ScheduleMissing BIT = 0  1: also schedule platform rows that have
                                       no task (receipt 0, a name, no delay.Task
                                       row: inserted with the trigger disabled,
                                       or bulk loaded, which skips triggers by
                                       default); 0: only report them
             @MaxRows INT = 1000       at most this many repairs per kind
Result set:  one row per finding: Finding NVARCHAR(32), TaskID BIGINT,
             Action NVARCHAR(32), Detail NVARCHAR(400).  Findings:
             QueueDisabled   dbo.DelayServiceQueue does not receive (poison
                             message detection disabled it): also raised as an
                             error (severity 16), so an Agent job step fails
                             and its alert fires; fix the cause (delay.Incident,
                             delay.Log), then ALTER QUEUE ... WITH STATUS = ON
             Orphaned        a Scheduled/Retrying task whose conversation no
                             longer exists (NEW_BROKER gives the database a
                             new broker identifier and removes every
                             conversation without an EndDialog, see
                             "Managing Service Broker Identities" below): a
                             new conversation and timer for the rest of its
                             delay (Rearmed)
             RunnerGone      a Running task with no conversation and no runner
                             holding its run lock: retried (Rearmed, counts as
                             an attempt) or, out of attempts, Failed (50348)
             NoTask          a pending platform row without a task: Scheduled
                             or Refused (with @ScheduleMissing = 1), else
                             Reported
             Receipt         a final task whose platform receipt is still 0
                             (its write after the RECEIVE transaction failed):
                             Repaired
             (an Orphaned task whose conversation a recovery ended, recorded
             in delay.Incident, is Failed, never re-armed)
References:  https://learn.microsoft.com/en-us/previous-versions/sql/sql-server-2008-r2/ms166057(v=sql.105)
Timing:      a re-armed task keeps its NextRunAtUtc (at least 1 s from now); a
             backfilled row is due F108218 seconds after F108217 (its created
             time, taken as UTC) or, without F108217, after now.
Transaction: one short transaction per repaired task (never one big one), each
             opened here; call it outside a transaction (50349 otherwise).
Lock order:  the task row (UPDLOCK; its old conversation is gone, so there is
             no conversation group to take first), then the new conversation
             (nobody else knows it yet), then dbo.tabDIYTable12402.
Security:    EXECUTE AS OWNER (conversations belong to dbo); for db_owner and
             MailqAdmin.
Example:     EXEC delay.Reconcile @Apply = 0;   -- what would it do?
             EXEC delay.Reconcile @ScheduleMissing = 1;
*/
CREATE OR ALTER PROCEDURE delay.Reconcile
    @Apply BIT = 1,
    @ScheduleMissing BIT = 0,
    @MaxRows INT = 1000
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE
        @Msg NVARCHAR(2048),
        @Now DATETIME2(3),
        @TaskID BIGINT,
        @TaskState NVARCHAR(16),
        @Handle UNIQUEIDENTIFIER,
        @NewHandle UNIQUEIDENTIFIER,
        @NextRunAtUtc DATETIME2(3),
        @Attempts INT,
        @MaxAttempts INT = 3,
        @Timeout INT,
        @MaxTimerSeconds INT = 86400,
        @MaxDelaySeconds INT = 31536000,
        @Name NVARCHAR(4000),
        @DelaySeconds INT,
        @CreatedAt DATETIME2(3),
        @TooLong BIT,
        @Refusal INT,
        @RefusalMessage NVARCHAR(400),
        @SchemaName SYSNAME,
        @ProcedureName SYSNAME,
        @Done INT;

    DECLARE @Finding TABLE (
        FindingId INT IDENTITY (1, 1) PRIMARY KEY,
        Finding NVARCHAR(32) NOT NULL,
        TaskID BIGINT NULL,
        Action NVARCHAR(32) NOT NULL,
        Detail NVARCHAR(400) NULL
    );

    IF @@TRANCOUNT > 0
        THROW 50349, N'delay.Reconcile opens one short transaction per task; call it outside a transaction.', 1;
    SET @Apply = ISNULL(@Apply, 1);
    SET @ScheduleMissing = ISNULL(@ScheduleMissing, 0);
    SET @MaxRows = IIF(@MaxRows IS NULL OR @MaxRows < 1, 1000, @MaxRows);

    SELECT @MaxAttempts = s.MaxAttempts FROM delay.Setting AS s WHERE s.SettingId = 1;

    -- 1. The queue.
    IF EXISTS (
        SELECT 1 FROM sys.service_queues AS q
        WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue') AND q.is_receive_enabled = 0
    )
        INSERT INTO @Finding (Finding, Action, Detail)
        VALUES (
            N'QueueDisabled', N'Reported',
            N'dbo.DelayServiceQueue is disabled; see delay.Incident, delay.Log; then ALTER QUEUE ... STATUS = ON'
        );

    -- 2. Pending and running tasks whose conversation is gone.
    SET @TaskID = NULL;
    SET @Done = 0;
    WHILE @Done < @MaxRows
    BEGIN
        -- An anti-join against the live endpoints (a CTE, so every column it names
        -- belongs to sys.conversation_endpoints alone); a NULL handle has no
        -- endpoint and counts as gone, as with NOT EXISTS.
        WITH LiveEndpoint AS (
            SELECT e.conversation_handle
            FROM sys.conversation_endpoints AS e
            WHERE e.state NOT IN ('CD', 'ER', 'DI')
        )

        SELECT TOP (1) @TaskID = t.TaskID
        FROM delay.Task AS t
        LEFT OUTER JOIN LiveEndpoint AS live ON t.ConversationHandle = live.conversation_handle
        WHERE
            t.TaskState IN (N'Scheduled', N'Retrying', N'Running')
            AND (@TaskID IS NULL OR t.TaskID > @TaskID)
            AND live.conversation_handle IS NULL
        ORDER BY t.TaskID;
        IF @@ROWCOUNT = 0
            BREAK;
        SET @Done += 1;

        BEGIN TRY
            BEGIN TRANSACTION;

            -- UPDLOCK, ROWLOCK: re-read under the lock; the task may have
            -- moved on since the scan.
            SELECT
                @TaskState = t.TaskState,
                @Handle = t.ConversationHandle,
                @NextRunAtUtc = t.NextRunAtUtc,
                @Attempts = t.Attempts
            FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
            WHERE t.TaskID = @TaskID;
            SET @Now = SYSUTCDATETIME();

            IF @TaskState IN (N'Scheduled', N'Retrying', N'Running') AND NOT EXISTS (
                SELECT 1 FROM sys.conversation_endpoints AS e
                WHERE e.conversation_handle = @Handle AND e.state NOT IN ('CD', 'ER', 'DI')
            )
            BEGIN
                IF @TaskState = N'Running'
                    AND APPLOCK_TEST(N'public', CONCAT(N'mailq-db/delay/task/', @TaskID), N'Exclusive', N'Session') = 0
                    -- Its runner is alive: its step 3 records the outcome
                    -- without a conversation.
                    INSERT INTO @Finding (Finding, TaskID, Action, Detail)
                    VALUES (N'RunnerGone', @TaskID, N'Left', N'running, its runner is alive; step 3 records it');
                ELSE IF EXISTS (
                    SELECT 1 FROM delay.Incident AS i
                    WHERE i.ConversationHandle = @Handle OR i.TaskID = @TaskID
                )
                BEGIN
                    -- dbo.ProcessDelayQueue could not process its message and
                    -- ended the conversation (delay.Incident): failed, never
                    -- re-armed into the same failure.
                    INSERT INTO @Finding (Finding, TaskID, Action, Detail)
                    VALUES (
                        N'Orphaned', @TaskID, N'Failed', N'its conversation was ended by a recovery (delay.Incident)'
                    );
                    IF @Apply = 1
                        EXEC delay.FinishTask
                            @TaskID = @TaskID,
                            @TaskState = N'Failed',
                            @EventName = N'BrokerError',
                            @ErrorNumber = 50346,
                            @ErrorMessage = N'a message of this task could not be processed (delay.Incident)';
                END;
                ELSE IF @TaskState = N'Running' AND @Attempts >= @MaxAttempts
                BEGIN
                    INSERT INTO @Finding (Finding, TaskID, Action) VALUES (N'RunnerGone', @TaskID, N'Failed');
                    IF @Apply = 1
                        EXEC delay.FinishTask
                            @TaskID = @TaskID,
                            @TaskState = N'Failed',
                            @EventName = N'RunnerLost',
                            @ErrorNumber = 50348,
                            @ErrorMessage = N'running with neither a conversation nor a runner; attempts exhausted';
                END;
                ELSE
                BEGIN
                    INSERT INTO @Finding (Finding, TaskID, Action, Detail)
                    VALUES (
                        IIF(@TaskState = N'Running', N'RunnerGone', N'Orphaned'), @TaskID, N'Rearmed',
                        CONCAT(N'was ', @TaskState, N' on a conversation that no longer exists')
                    );
                    IF @Apply = 1
                    BEGIN
                        BEGIN DIALOG CONVERSATION @NewHandle
                            FROM SERVICE MailqDelayService
                            TO SERVICE N'MailqDelayService', N'CURRENT DATABASE'
                            ON CONTRACT MailqDelayContract
                            WITH ENCRYPTION = OFF;

                        SET @NextRunAtUtc = IIF(
                            @TaskState = N'Running' OR @NextRunAtUtc IS NULL OR @NextRunAtUtc < @Now,
                            @Now, @NextRunAtUtc
                        );
                        SET @Timeout = CAST(CASE
                            WHEN DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc) >= @MaxTimerSeconds THEN @MaxTimerSeconds
                            WHEN DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc) < 1 THEN 1
                            ELSE DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc)
                        END AS INT);
                        BEGIN CONVERSATION TIMER (@NewHandle) TIMEOUT = @Timeout;

                        UPDATE delay.Task
                        SET
                            ConversationHandle = @NewHandle,
                            TaskState = IIF(@TaskState = N'Running', N'Retrying', @TaskState),
                            NextRunAtUtc = @NextRunAtUtc,
                            LeaseUntilUtc = NULL,
                            LastErrorNumber = IIF(@TaskState = N'Running', 50348, LastErrorNumber),
                            LastErrorMessage = IIF(
                                @TaskState = N'Running',
                                N'running with neither a conversation nor a runner; retried (delay.Reconcile)',
                                LastErrorMessage
                            )
                        WHERE TaskID = @TaskID;

                        INSERT INTO delay.Log (TaskID, EventName, ErrorNumber, ErrorMessage, ConversationHandle)
                        VALUES (
                            @TaskID, IIF(@TaskState = N'Running', N'RunnerLost', N'BrokerError'), 50348,
                            CONCAT(N'conversation ', CAST(@Handle AS NVARCHAR(36)),
                                N' no longer exists; re-armed on a new one by delay.Reconcile'),
                            @NewHandle
                        );
                    END;
                END;
            END;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;
            INSERT INTO @Finding (Finding, TaskID, Action, Detail)
            VALUES (N'Orphaned', @TaskID, N'Error', LEFT(CONCAT(ERROR_NUMBER(), N': ', ERROR_MESSAGE()), 400));
        END CATCH;
    END;

    -- 3. Pending platform rows without a task.
    SET @TaskID = NULL;
    SET @Done = 0;
    WHILE @Done < @MaxRows
    BEGIN
        SELECT TOP (1)
            @TaskID = p.ID,
            @Name = CAST(p.F108211 AS NVARCHAR(4000)),
            @DelaySeconds = CASE WHEN p.F108218 IS NULL THEN 0 ELSE TRY_CONVERT(INT, p.F108218) END,
            @CreatedAt = TRY_CONVERT(DATETIME2(3), p.F108217),
            @TooLong = CASE
                WHEN
                    LEN(CAST(p.F108212 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(p.F108213 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(p.F108214 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(p.F108215 AS NVARCHAR(MAX)) + N'.') > 201
                    OR LEN(CAST(p.F108216 AS NVARCHAR(MAX)) + N'.') > 201
                    THEN 1
                ELSE 0
            END
        FROM dbo.tabDIYTable12402 AS p
        WHERE
            ISNULL(p.F108219, 0) = 0
            AND p.F108211 IS NOT NULL
            AND (@TaskID IS NULL OR p.ID > @TaskID)
            AND NOT EXISTS (SELECT 1 FROM delay.Task AS t WHERE t.TaskID = p.ID)
        ORDER BY p.ID;
        IF @@ROWCOUNT = 0
            BREAK;
        SET @Done += 1;

        IF @Apply = 0 OR @ScheduleMissing = 0
        BEGIN
            INSERT INTO @Finding (Finding, TaskID, Action, Detail)
            VALUES (
                N'NoTask', @TaskID, N'Reported', N'pending row, no task; EXEC delay.Reconcile @ScheduleMissing = 1'
            );
            CONTINUE;
        END;

        SELECT
            @Refusal = r.RefusalNumber,
            @RefusalMessage = r.RefusalMessage,
            @SchemaName = r.SchemaName,
            @ProcedureName = r.ProcedureName
        FROM delay.ResolveTarget(@Name) AS r;
        IF @DelaySeconds IS NULL OR @DelaySeconds NOT BETWEEN 0 AND @MaxDelaySeconds
            SELECT @Refusal = 50302, @RefusalMessage = N'delay F108218 is not 0-31,536,000 seconds';
        ELSE IF @TooLong = 1
            SELECT
                @Refusal = 50303,
                @RefusalMessage = N'a parameter F108212-F108216 is longer than the target''s 200 characters';

        SET @Now = SYSUTCDATETIME();
        SET @NextRunAtUtc = DATEADD(SECOND, ISNULL(@DelaySeconds, 0), ISNULL(@CreatedAt, @Now));

        BEGIN TRY
            BEGIN TRANSACTION;

            INSERT INTO delay.Task (
                TaskID, TargetName, SchemaName, ProcedureName, DelaySeconds, TaskState,
                CreatedAtUtc, DueAtUtc, NextRunAtUtc, FinishedAtUtc, LastErrorNumber, LastErrorMessage, CreatedBy
            )
            VALUES (
                @TaskID, LEFT(@Name, 400), @SchemaName, @ProcedureName, @DelaySeconds,
                IIF(@Refusal IS NULL, N'Scheduled', N'Refused'),
                @Now,
                IIF(@Refusal IS NULL, @NextRunAtUtc, NULL),
                IIF(@Refusal IS NULL, @NextRunAtUtc, NULL),
                IIF(@Refusal IS NULL, NULL, @Now),
                @Refusal, @RefusalMessage, N'delay.Reconcile'
            );

            IF @Refusal IS NOT NULL
            BEGIN
                INSERT INTO delay.Log (TaskID, EventName, TargetName, ErrorNumber, ErrorMessage)
                VALUES (@TaskID, N'Refused', LEFT(@Name, 400), @Refusal, @RefusalMessage);
                UPDATE dbo.tabDIYTable12402 SET F108219 = 2 WHERE ID = @TaskID;
                INSERT INTO @Finding (Finding, TaskID, Action, Detail)
                VALUES (N'NoTask', @TaskID, N'Refused', @RefusalMessage);
            END;
            ELSE
            BEGIN
                BEGIN DIALOG CONVERSATION @NewHandle
                    FROM SERVICE MailqDelayService
                    TO SERVICE N'MailqDelayService', N'CURRENT DATABASE'
                    ON CONTRACT MailqDelayContract
                    WITH ENCRYPTION = OFF;
                SET @Timeout = CAST(CASE
                    WHEN DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc) >= @MaxTimerSeconds THEN @MaxTimerSeconds
                    WHEN DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc) < 1 THEN 1
                    ELSE DATEDIFF_BIG(SECOND, @Now, @NextRunAtUtc)
                END AS INT);
                BEGIN CONVERSATION TIMER (@NewHandle) TIMEOUT = @Timeout;
                UPDATE delay.Task SET ConversationHandle = @NewHandle WHERE TaskID = @TaskID;
                INSERT INTO @Finding (Finding, TaskID, Action) VALUES (N'NoTask', @TaskID, N'Scheduled');
            END;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;
            INSERT INTO @Finding (Finding, TaskID, Action, Detail)
            VALUES (N'NoTask', @TaskID, N'Error', LEFT(CONCAT(ERROR_NUMBER(), N': ', ERROR_MESSAGE()), 400));
        END CATCH;
    END;

    -- 4. Receipts that could not be written (dbo.ProcessDelayQueue writes
    -- them after its RECEIVE transaction commits, so a constraint or trigger
    -- of the platform's can leave one behind).
    BEGIN TRY
        IF @Apply = 1
            UPDATE TOP (@MaxRows) p
            SET F108219 = CASE t.TaskState
                WHEN N'Done' THEN 1
                WHEN N'Refused' THEN 2
                WHEN N'Failed' THEN 3
                WHEN N'Cancelled' THEN 4
                ELSE 0
            END
            OUTPUT N'Receipt', inserted.ID, N'Repaired' INTO @Finding (Finding, TaskID, Action)
            FROM dbo.tabDIYTable12402 AS p
            INNER JOIN delay.Task AS t ON p.ID = t.TaskID
            WHERE t.TaskState IN (N'Done', N'Refused', N'Failed', N'Cancelled') AND ISNULL(p.F108219, 0) = 0;
        ELSE
            INSERT INTO @Finding (Finding, TaskID, Action)
            SELECT TOP (@MaxRows) N'Receipt', p.ID, N'Reported'
            FROM dbo.tabDIYTable12402 AS p
            INNER JOIN delay.Task AS t ON p.ID = t.TaskID
            WHERE t.TaskState IN (N'Done', N'Refused', N'Failed', N'Cancelled') AND ISNULL(p.F108219, 0) = 0;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() <> 0
            ROLLBACK TRANSACTION;
        INSERT INTO @Finding (Finding, Action, Detail)
        VALUES (N'Receipt', N'Error', LEFT(CONCAT(ERROR_NUMBER(), N': ', ERROR_MESSAGE()), 400));
    END CATCH;

    SELECT f.Finding, f.TaskID, f.Action, f.Detail
    FROM @Finding AS f
    ORDER BY f.FindingId;

    IF EXISTS (SELECT 1 FROM @Finding AS f WHERE f.Finding = N'QueueDisabled')
        -- Severity 16: an Agent job step that runs this fails, so the job's
        -- notification or an alert on the job failure tells a DBA.  (A
        -- BROKER_QUEUE_DISABLED event notification would need a second queue
        -- and service to receive it; this monitor needs none.)
        RAISERROR (
            N'mailq-db: dbo.DelayServiceQueue is disabled (poison message detection); see %s, then %s.',
            16, 1, N'delay.Incident and delay.Log', N'ALTER QUEUE dbo.DelayServiceQueue WITH STATUS = ON'
        );
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
dbo.CancelDelayExecution: cancels a task that has not started: its receipt
becomes 4, its conversation ends (which drops its timer), and it never runs.
Parameters:  @TaskID BIGINT, required: the ID InitiateDelayExecution returned
             (dbo.tabDIYTable12402.ID)
Result set:  none.
Errors:      50320 @TaskID missing or names no scheduled task
             50321 the task is not Scheduled or Retrying (already running or
                   finished; the message names its state)
             50342 the task was initiated by another login, and the caller is
                   neither in MailqAdmin nor db_owner
             50343 the task's conversation no longer exists (the database was
                   copied and given a NEW_BROKER, or a conversation was ended
                   by hand): run EXEC delay.Reconcile, then cancel again
Who:         members of MailqAdmin and db_owner cancel any task; everybody
             else (role MailqDelayCaller) only the tasks their own login
             initiated (delay.Task.CreatedBy = ORIGINAL_LOGIN()), as DESIGN.md
             and the DBA guide say.  Tasks inserted by the platform belong to
             the platform's login.
Transaction: opens its own if none is open, else works inside the caller's;
             any error, a refusal included, dooms the caller's transaction
             (XACT_ABORT ON) and is re-raised: the caller must roll back.  No
             savepoint: SAVE TRANSACTION fails inside a distributed (MSDTC)
             transaction (error 627), and a doomed transaction cannot return
             to one.  Validation runs before any work, so a refusal changes
             nothing that a rollback would have to undo.
Lock order:  the task's cancel lock (an application lock, transaction-owned),
             then the task's conversation group (BEGIN CONVERSATION TIMER
             locks it), then its delay.Task row (UPDLOCK), then
             dbo.tabDIYTable12402: the order of dbo.ProcessDelayQueue (a
             delay-0 request takes the cancel lock and the task's group
             before the row too; a timer message holds the group already).
Security:    runs as the caller, to learn the caller's roles; the work is done
             by delay.CancelTask (EXECUTE AS OWNER, reached through ownership
             chaining, granted to nobody): END CONVERSATION needs the
             conversation's owner (dbo, who began it in the trigger).
Example:     EXEC dbo.CancelDelayExecution @TaskID = 42;
*/
CREATE OR ALTER PROCEDURE dbo.CancelDelayExecution
    @TaskID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    -- Evaluated here, in the caller's security context (delay.CancelTask
    -- runs as dbo, who is a member of everything).
    DECLARE @MayCancelAny BIT = IIF(
        IS_MEMBER(N'MailqAdmin') = 1 OR IS_MEMBER(N'db_owner') = 1, 1, 0
    );
    DECLARE @CallerLogin NVARCHAR(128) = ORIGINAL_LOGIN();

    EXEC delay.CancelTask
        @TaskID = @TaskID,
        @CallerLogin = @CallerLogin,
        @MayCancelAny = @MayCancelAny;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
delay.CancelTask: the work of dbo.CancelDelayExecution (see its header for the
contract, errors, transaction and lock order).  Internal: granted to nobody;
reached from dbo.CancelDelayExecution through ownership chaining, which also
passes the caller's login and whether the caller may cancel any task.
Parameters:  @TaskID BIGINT, @CallerLogin NVARCHAR(128), @MayCancelAny BIT
Errors:      50320, 50321, 50342, 50343 (docs/errors.md)
Security:    EXECUTE AS OWNER: BEGIN CONVERSATION TIMER and END CONVERSATION
             need the conversation's owner (dbo).
Example:     EXEC delay.CancelTask @TaskID = 42, @CallerLogin = N'app', @MayCancelAny = 0;
*/
CREATE OR ALTER PROCEDURE delay.CancelTask
    @TaskID BIGINT,
    @CallerLogin NVARCHAR(128),
    @MayCancelAny BIT
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- The UPDLOCK reads below must lock the latest committed row: READ COMMITTED
    -- whatever the caller runs under (a level set in a procedure reverts when it
    -- returns; under RCSI an UPDLOCK read still takes and honours locks).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE
        @Msg NVARCHAR(2048),
        @Handle UNIQUEIDENTIFIER,
        @TaskState NVARCHAR(16),
        @CreatedBy NVARCHAR(128),
        @LockName NVARCHAR(255),
        @LockResult INT;

    -- 1. Validate before any transaction starts.
    SELECT
        @Handle = t.ConversationHandle,
        @TaskState = t.TaskState,
        @CreatedBy = t.CreatedBy
    FROM delay.Task AS t
    WHERE t.TaskID = @TaskID;

    IF @TaskState IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID names no delayed task; got ', ISNULL(CAST(@TaskID AS NVARCHAR(20)), N'NULL'), N'.'
        );
        THROW 50320, @Msg, 1;
    END;

    IF ISNULL(@MayCancelAny, 0) = 0 AND (@CreatedBy IS NULL OR @CreatedBy <> @CallerLogin)
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID ', @TaskID, N' was initiated by another login; only MailqAdmin or db_owner ',
            N'may cancel it (caller: ', ISNULL(@CallerLogin, N'NULL'), N').'
        );
        THROW 50342, @Msg, 1;
    END;

    IF @TaskState NOT IN (N'Scheduled', N'Retrying') OR @Handle IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID ', @TaskID, N' is ', @TaskState,
            N'; only a Scheduled or Retrying task can be cancelled.'
        );
        THROW 50321, @Msg, 1;
    END;

    -- A conversation that no longer exists cannot be locked or ended; after
    -- ALTER DATABASE ... SET NEW_BROKER every conversation is gone and no
    -- EndDialog ever arrives.
    IF NOT EXISTS (
        SELECT 1 FROM sys.conversation_endpoints AS e
        WHERE e.conversation_handle = @Handle AND e.state NOT IN ('CD', 'ER', 'DI')
    )
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID ', @TaskID, N' has lost its conversation (a database copy with NEW_BROKER?); ',
            N'run EXEC delay.Reconcile, which re-arms or fails such tasks, then cancel again.'
        );
        THROW 50343, @Msg, 1;
    END;

    -- 2. Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1
            BEGIN TRANSACTION;

        -- The task's cancel lock first (a delay-0 request takes it too, so
        -- the two never wait for each other's conversation group), then
        -- the conversation group.
        SET @LockName = CONCAT(N'mailq-db/delay/cancel/', @TaskID);
        EXEC @LockResult = sys.sp_getapplock
            @Resource = @LockName,
            @LockMode = N'Exclusive',
            @LockOwner = N'Transaction',
            @LockTimeout = -1;
        IF @LockResult < 0
        BEGIN
            SET @Msg = CONCAT(N'@TaskID ', @TaskID, N': its cancel lock was not granted (', @LockResult, N').');
            THROW 50321, @Msg, 1;
        END;

        -- Lock order: the conversation group next.  The 1-second timer is
        -- only the lock: the task is either cancelled below (its conversation
        -- ends, timer and all) or refused, which dooms the transaction, so
        -- the timer never survives.
        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = 1;

        -- UPDLOCK: hold the row from this check to the state change, so the
        -- activation procedure cannot start the task in between.
        -- ROWLOCK: one task, one row lock.
        SELECT @TaskState = t.TaskState
        FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
        WHERE t.TaskID = @TaskID;

        IF @TaskState NOT IN (N'Scheduled', N'Retrying')
        BEGIN
            SET @Msg = CONCAT(
                N'@TaskID ', @TaskID, N' is ', @TaskState,
                N'; only a Scheduled or Retrying task can be cancelled.'
            );
            THROW 50321, @Msg, 1;
        END;

        SET @Msg = CONCAT(N'cancelled by ', @CallerLogin);
        EXEC delay.FinishTask
            @TaskID = @TaskID,
            @TaskState = N'Cancelled',
            @EventName = N'Cancelled',
            @ErrorMessage = @Msg;

        IF @OwnTran = 1
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened; a caller's transaction is doomed by
        -- XACT_ABORT and its own CATCH rolls it back.
        IF @OwnTran = 1 AND XACT_STATE() <> 0
            ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
dbo.ProcessDelayQueue: activation procedure of dbo.DelayServiceQueue; runs due
delayed tasks.  Service Broker starts it (EXECUTE AS OWNER, up to
MAX_QUEUE_READERS copies); it loops until the queue stays empty for
delay.Setting.ReceiveWaitMs, then returns.
Parameters:  none.  Result sets: none.
Messages:    DialogTimer (on a task's initiator handle): the delay, a retry's
                 backoff or the watchdog lease has expired
             MailqDelayRequest (on the target handle; body = task ID):
                 a task with delay 0, to run at once; it runs only if the task
                 is still bound to this very conversation (the initiator
                 handle of the same conversation_id), never by the ID alone
             EndDialog, Error: end this side of the conversation; a task still
                 pending on it is failed (BrokerError)

One pass of the loop, with its transaction boundaries and lock order:

  +-- STEP 1 (tran A) ---------------------------------------------------+
  | WAITFOR (RECEIVE TOP (1)) ......... locks the message's conversation  |
  |                                     group G(msg)                      |
  | [DelayRequest only] sp_getapplock cancel lock (Transaction), then     |
  |   BEGIN CONVERSATION TIMER (task's initiator handle) . locks G(task)  |
  | SELECT delay.Task WITH (UPDLOCK, ROWLOCK) ....... locks the task row  |
  | due -> sp_getapplock run lock (Session) .. a lock outside the tran    |
  |        Running, attempt + 1, lease timer                              |
  | final -> delay.Task and END CONVERSATION only (FinishTask @SetReceipt |
  |        = 0): never the platform's table inside a RECEIVE transaction  |
  | COMMIT                                                                |
  +-----------------------------------------------------------------------+
     | failed: ROLLBACK (the message is back on the queue: 1 rollback)
     |   1205, first time for this message in this reader: nothing else;
     |         the next RECEIVE redelivers it (one ordinary redelivery)
     |   otherwise -> RECOVERY
  +-- RECOVERY (tran R; runs only after a failed step 1) ----------------+
  | RECEIVE TOP (1) ... WHERE conversation_handle = @Handle               |
  | nothing received (another reader took it): COMMIT, go on              |
  | else INSERT delay.Incident (no CHECK, no trigger, no FK), END         |
  | CONVERSATION @Handle, COMMIT.  Nothing else: never delay.FinishTask,  |
  | never the platform's table (whose constraints or triggers we do not   |
  | own).  If tran R fails too: ROLLBACK (2nd rollback), RAISERROR to the |
  | error log, the reader stops.                                          |
  +-----------------------------------------------------------------------+
  +-- RECOVERY FOLLOW-UP (tran F, no RECEIVE) ---------------------------+
  | a Scheduled/Retrying task whose conversation tran R ended: FinishTask |
  | 'Failed' (50346).  Its failure can never count against the queue; it  |
  | is logged and left to delay.Reconcile.                                |
  +-----------------------------------------------------------------------+
  +-- STEP 2 (tran T, the target's) -------------------------------------+
  | sp_executesql: SET DEADLOCK_PRIORITY NORMAL; SET XACT_ABORT OFF;      |
  | SET LOCK_TIMEOUT n; EXEC [schema].[proc] @SPName = @SPName, ...       |
  | (SET options set in the dynamic batch revert when it returns; the     |
  | reader re-asserts its own after it anyway)                            |
  +-----------------------------------------------------------------------+
  +-- STEP 3 (tran B) ---------------------------------------------------+
  | BEGIN CONVERSATION TIMER (task handle, if the endpoint still exists)  |
  |                                 ... locks G(task)                     |
  | SELECT delay.Task WITH (UPDLOCK, ROWLOCK) ....... locks the task row  |
  | Done | Retrying (+ backoff timer) | Failed (GaveUp); COMMIT           |
  | (1205: tried again, at most 3 times)                                  |
  +-----------------------------------------------------------------------+
  RECEIPT (autocommit UPDATE, no transaction of ours): F108219 of a task
  that step 1 or step 3 made final (FinishTask @SetReceipt = 0 in both);
  a failure is logged, delay.Reconcile repairs it.
  RELEASE: the run lock, if this pass holds it, exactly once (one call
  site, guarded by @LockHeld, which it clears first).

Lock order:  the task's conversation group first, then its delay.Task row,
             then dbo.tabDIYTable12402 (delay.FinishTask, the receipt) - the
             same in dbo.CancelDelayExecution, delay.Reconcile and every
             transaction here.  A delay-0 request and a cancel both take the
             task's cancel lock (an application lock) before its group.  For a DelayRequest the
target side's group comes first (RECEIVE), and no other procedure ever takes
that group, so it cannot close a cycle.
Pattern:     DESIGN.md pattern (a), "receive, record, commit; then run": only
             our own bookkeeping runs in a transaction that received a
             message, so no target can make it roll back.  (Service Broker
             disables a queue after five rollbacks in a row of transactions
             that received from it:
             https://learn.microsoft.com/en-us/sql/database-engine/service-broker/removing-poison-messages)
             A failing step 1 costs at most two rollbacks of one message in
             this reader (1205: three), then the message is gone.
Watchdog:    while a task runs, its runner holds a session-owned application
             lock named for the task, taken in step 1 before its COMMIT.  When
             the lease timer fires, APPLOCK_TEST tells whether the runner is
             alive (slow: the lease is extended, a Slow row logged) or gone
             (RunnerLost: the attempt failed, retried or given up).
             Timers longer than one day are chained (86,400 s each).
Settings:    the reader runs DEADLOCK_PRIORITY HIGH and XACT_ABORT ON for its
             own bookkeeping; the target runs NORMAL, XACT_ABORT OFF and, if
             delay.Setting.TargetLockTimeoutMs is set, that LOCK_TIMEOUT.  A
             target is called inside the reader's TRY block: an error in it
             ends it and is caught here (T-SQL TRY...CATCH semantics), so a
             target that wants to handle its own errors uses TRY...CATCH.
Errors:      none raised, except the RAISERROR of a failed recovery or a
             disabled queue (it goes to the SQL Server error log: activation
             writes a reader's messages there).  Failures go to delay.Log and
             delay.Incident (docs/errors.md 503xx).
Example:     started by Service Broker; to drain by hand: EXEC dbo.ProcessDelayQueue;
*/
CREATE OR ALTER PROCEDURE dbo.ProcessDelayQueue
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- The UPDLOCK reads below must lock the latest committed row: READ COMMITTED
    -- whatever the caller runs under (a level set in a procedure reverts when it
    -- returns; under RCSI an UPDLOCK read still takes and honours locks).
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SET DEADLOCK_PRIORITY HIGH;

    DECLARE
        @Handle UNIQUEIDENTIFIER,
        @MessageType SYSNAME,
        @Body VARBINARY(MAX),
        @Now DATETIME2(3),
        @TaskID BIGINT,
        @TaskHandle UNIQUEIDENTIFIER,
        @BoundHandle UNIQUEIDENTIFIER,
        @Unbound BIT,
        @LogText NVARCHAR(2047),
        @InitiatorHandle UNIQUEIDENTIFIER,
        @TaskState NVARCHAR(16),
        @TargetName NVARCHAR(400),
        @NextRunAtUtc DATETIME2(3),
        @LeaseUntilUtc DATETIME2(3),
        @Attempts INT,
        @Attempt INT,
        @RemainingMs BIGINT,
        @Timeout INT,
        @Refusal INT,
        @RefusalMessage NVARCHAR(400),
        @SchemaName SYSNAME,
        @ProcedureName SYSNAME,
        @SPName NVARCHAR(200),
        @Param1 NVARCHAR(200),
        @Param2 NVARCHAR(200),
        @Param3 NVARCHAR(200),
        @Param4 NVARCHAR(200),
        @Param5 NVARCHAR(200),
        @TooLong BIT,
        @Run BIT,
        @Retryable BIT,
        @Stop BIT = 0,
        @Recover BIT,
        @Recovered BIT,
        @Step1Committed BIT,
        @RedeliveredHandle UNIQUEIDENTIFIER,
        @EndpointOpen BIT,
        @Sql NVARCHAR(MAX),
        -- The target contract: (@SPName, @Param1 ... @Param5 NVARCHAR(200)).
        @ParameterList NVARCHAR(400) = CONCAT(
            N'@SPName NVARCHAR(200), @Param1 NVARCHAR(200), @Param2 NVARCHAR(200), ',
            N'@Param3 NVARCHAR(200), @Param4 NVARCHAR(200), @Param5 NVARCHAR(200)'
        ),
        @LockName NVARCHAR(255),
        @LockResult INT,
        @LockHeld BIT = 0,
        @CancelLockName NVARCHAR(255),
        @ErrorNumber INT,
        @ErrorMessage NVARCHAR(4000),
        @ErrorXml XML,
        @StepErrorNumber INT,
        @StepErrorMessage NVARCHAR(4000),
        @TargetTranCount INT,
        @Backoff BIGINT,
        @Recorded BIT,
        @Try INT,
        @MaxAttempts INT,
        @RetryBaseSeconds INT,
        @RetryMaxSeconds INT,
        @LeaseSeconds INT,
        @ReceiveWaitMs INT,
        @TargetLockTimeoutMs INT;

    DECLARE
        @DialogTimer SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer',
        @EndDialog SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog',
        @BrokerError SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/Error',
        @DelayRequest SYSNAME = N'MailqDelayRequest',
        -- A conversation timer never exceeds one day; longer delays are chained.
        @MaxTimerSeconds INT = 86400,
        -- A timer that fires less than this before the due time counts as due
        -- (timers have whole-second resolution).
        @EarlyToleranceMs INT = 500;

    WHILE @Stop = 0
    BEGIN
        SELECT
            @Handle = NULL,
            @MessageType = NULL,
            @Body = NULL,
            @TaskID = NULL,
            @TaskHandle = NULL,
            @BoundHandle = NULL,
            @Unbound = 0,
            @InitiatorHandle = NULL,
            @TaskState = NULL,
            @Run = 0,
            @Recover = 0,
            @Recovered = 0,
            @Step1Committed = 0,
            @Recorded = 0,
            @LockName = NULL,
            @MaxAttempts = 3,
            @RetryBaseSeconds = 30,
            @RetryMaxSeconds = 3600,
            @LeaseSeconds = 600,
            @ReceiveWaitMs = 5000,
            @TargetLockTimeoutMs = NULL;

        SELECT
            @MaxAttempts = s.MaxAttempts,
            @RetryBaseSeconds = s.RetryBaseSeconds,
            @RetryMaxSeconds = s.RetryMaxSeconds,
            @LeaseSeconds = s.LeaseSeconds,
            @ReceiveWaitMs = s.ReceiveWaitMs,
            @TargetLockTimeoutMs = s.TargetLockTimeoutMs
        FROM delay.Setting AS s
        WHERE s.SettingId = 1;

        --==================================================================
        -- STEP 1: receive one message and do the bookkeeping; commit.
        --==================================================================
        BEGIN TRY
            BEGIN TRANSACTION;

            -- WAITFOR (RECEIVE ...), TIMEOUT: waits up to @ReceiveWaitMs
            -- milliseconds for a message; no message means the reader exits.
            -- RECEIVE locks the message's conversation group until COMMIT.
            WAITFOR (
                RECEIVE TOP (1)
                    @Handle = conversation_handle,
                    @MessageType = message_type_name,
                    @Body = message_body
                FROM dbo.DelayServiceQueue
            ), TIMEOUT @ReceiveWaitMs;

            IF @Handle IS NULL
                SET @Stop = 1;
            ELSE
            BEGIN
                SET @Now = SYSUTCDATETIME();

                IF @MessageType = @DelayRequest
                BEGIN
                    SET @TaskID = CAST(@Body AS BIGINT);
                    -- The request arrived on the target side of the task's
                    -- dialog; both sides share one conversation_id.  The
                    -- initiator side is the handle the task must be bound to
                    -- (a task ID alone may have been reused after the platform
                    -- truncated its table).
                    SELECT @InitiatorHandle = i.conversation_handle
                    FROM sys.conversation_endpoints AS t
                    INNER JOIN sys.conversation_endpoints AS i
                        ON t.conversation_id = i.conversation_id AND i.is_initiator = 1
                    WHERE t.conversation_handle = @Handle AND t.is_initiator = 0;

                    -- No lock yet: the conversation group comes before the row.
                    SELECT @BoundHandle = t.ConversationHandle
                    FROM delay.Task AS t
                    WHERE t.TaskID = @TaskID;

                    IF @BoundHandle IS NULL OR @InitiatorHandle IS NULL OR @BoundHandle <> @InitiatorHandle
                        -- Not bound to this conversation: never run.  (Both
                        -- known and different: the ID was reused; logged below.)
                        SELECT
                            @Unbound = IIF(@BoundHandle IS NOT NULL AND @InitiatorHandle IS NOT NULL, 1, 0),
                            @TaskID = NULL;
                    ELSE
                    BEGIN
                        -- The task's cancel lock (transaction-owned), taken by
                        -- delay.CancelTask first too: once we hold it, a cancel
                        -- has either committed (its conversation is closed and
                        -- the check below sees it) or not started, so the
                        -- timer below never meets a conversation that a cancel
                        -- ends while we wait for its group.
                        SET @LockResult = NULL;
                        SET @CancelLockName = CONCAT(N'mailq-db/delay/cancel/', @TaskID);
                        EXEC @LockResult = sys.sp_getapplock
                            @Resource = @CancelLockName,
                            @LockMode = N'Exclusive',
                            @LockOwner = N'Transaction',
                            @LockTimeout = -1;
                        IF @LockResult < 0
                            -- Chosen as a deadlock victim (-3) or cancelled:
                            -- transient, treated like 1205 below.
                            THROW 50350, N'the task''s cancel lock was not granted; the request is redelivered', 1;
                    END;

                    IF @TaskID IS NOT NULL AND EXISTS (
                        SELECT 1 FROM sys.conversation_endpoints AS e
                        WHERE e.conversation_handle = @BoundHandle AND e.state NOT IN ('CD', 'ER', 'DI')
                    )
                    BEGIN
                        -- Lock order: the task's conversation group before its
                        -- row, as everywhere (BEGIN CONVERSATION TIMER locks
                        -- the group).  The timer is the lease of the run about
                        -- to start; if the task is not run, a spare timer
                        -- fires later and finds nothing to do.
                        SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                        BEGIN CONVERSATION TIMER (@BoundHandle) TIMEOUT = @Timeout;
                    END;
                    -- else: bound, but its conversation is ending (the task is
                    -- final): the final-state branch below leaves it alone.
                END;
                ELSE
                    SELECT @TaskID = t.TaskID
                    FROM delay.Task AS t
                    WHERE t.ConversationHandle = @Handle;

                -- UPDLOCK: hold the row for this state transition, so a cancel or
                -- another reader cannot move the task between our read and write.
                -- ROWLOCK: one task, one row lock.
                SELECT
                    @TaskState = t.TaskState,
                    @TaskHandle = t.ConversationHandle,
                    @TargetName = t.TargetName,
                    @NextRunAtUtc = t.NextRunAtUtc,
                    @LeaseUntilUtc = t.LeaseUntilUtc,
                    @Attempts = t.Attempts
                FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
                WHERE t.TaskID = @TaskID;

                ------------------------------------------------------------
                -- 1a. EndDialog / Error
                ------------------------------------------------------------
                IF @MessageType IN (@EndDialog, @BrokerError)
                BEGIN
                    IF @MessageType = @BrokerError
                    BEGIN
                        -- The body of an Error message is
                        -- <Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error">
                        --   <Code>n</Code><Description>text</Description></Error>
                        -- (*: matches that namespace without declaring it.)
                        SET @ErrorXml = CAST(@Body AS XML);
                        SELECT
                            @ErrorNumber = @ErrorXml.value('(/*:Error/*:Code)[1]', 'INT'),
                            @ErrorMessage = @ErrorXml.value('(/*:Error/*:Description)[1]', 'NVARCHAR(4000)');
                    END;
                    ELSE
                        SELECT
                            @ErrorNumber = 50333,
                            @ErrorMessage = N'the conversation was ended by its other side before the task finished';

                    IF @TaskState IN (N'Scheduled', N'Running', N'Retrying') AND @TaskHandle = @Handle
                        -- Ends @Handle, the task's own conversation.
                        EXEC delay.FinishTask
                            @SetReceipt = 0,
                            @TaskID = @TaskID,
                            @TaskState = N'Failed',
                            @EventName = N'BrokerError',
                            @ErrorNumber = @ErrorNumber,
                            @ErrorMessage = @ErrorMessage;
                    ELSE
                        -- The target side of a delay-0 dialog, or a conversation
                        -- whose task is already final: just end this side.
                        END CONVERSATION @Handle;
                END;
                ------------------------------------------------------------
                -- 1b. Messages with nothing to run
                ------------------------------------------------------------
                ELSE IF @MessageType NOT IN (@DialogTimer, @DelayRequest)
                    -- Not ours (nothing else is in the contract): drop the conversation.
                    END CONVERSATION @Handle;
                ELSE IF @TaskState IS NULL
                BEGIN
                    -- No task bound to this conversation (replaced, never
                    -- recorded, or a request whose ID now names another
                    -- task): nothing to run.
                    IF @Unbound = 1
                        INSERT INTO delay.Log (TaskID, EventName, ErrorNumber, ErrorMessage, ConversationHandle)
                        VALUES (
                            CAST(@Body AS BIGINT), N'BrokerError', 50347,
                            N'a delay-0 request arrived on a conversation the task is not bound to; not run',
                            @Handle
                        );
                    END CONVERSATION @Handle;
                END;
                ELSE IF @TaskState IN (N'Done', N'Failed', N'Refused', N'Cancelled')
                BEGIN
                    -- Final already.  A late timer ends its conversation; a late
                    -- DelayRequest leaves the target side to the EndDialog that
                    -- the initiator side's END CONVERSATION sent.
                    IF @MessageType = @DialogTimer
                        END CONVERSATION @Handle;
                END;
                ELSE IF @MessageType = @DelayRequest AND @TaskState <> N'Scheduled'
                    -- A run already started through the task's own conversation.
                    SET @Run = 0;
                ------------------------------------------------------------
                -- 1c. The watchdog: a lease timer of a Running task
                ------------------------------------------------------------
                ELSE IF @MessageType = @DialogTimer AND @TaskState = N'Running'
                BEGIN
                    SET @RemainingMs = DATEDIFF_BIG(MILLISECOND, @Now, @LeaseUntilUtc);
                    IF @RemainingMs > @EarlyToleranceMs
                    BEGIN
                        -- Early (chained or re-armed timer): wait for the rest of the lease.
                        SET @Timeout = CASE
                            WHEN @RemainingMs >= CAST(@MaxTimerSeconds AS BIGINT) * 1000 THEN @MaxTimerSeconds
                            ELSE CAST((@RemainingMs + 999) / 1000 AS INT)
                        END;
                        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
                    END;
                    -- Is the runner alive?  It holds this session-owned lock for
                    -- as long as the target runs; a session that ended released
                    -- it.  APPLOCK_TEST only tests (1: grantable = free), so
                    -- there is nothing to release here.
                    ELSE IF APPLOCK_TEST(
                            N'public', CONCAT(N'mailq-db/delay/task/', @TaskID), N'Exclusive', N'Session'
                        ) = 0
                    BEGIN
                        -- Alive and slow: extend the lease, never interrupt.
                        UPDATE delay.Task
                        SET LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now)
                        WHERE TaskID = @TaskID;

                        SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;

                        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorMessage, ConversationHandle)
                        VALUES (
                            @TaskID, N'Slow', @TargetName, @Attempts,
                            CONCAT(N'attempt ', @Attempts, N' still running after its lease; lease extended by ',
                                @LeaseSeconds, N' s'),
                            @Handle
                        );
                    END;
                    ELSE
                    BEGIN
                        SET @ErrorMessage = CONCAT(
                            N'attempt ', @Attempts, N' ended without reporting: its session ended while the target ran'
                        );
                        IF @Attempts < @MaxAttempts
                        BEGIN
                            SET @Backoff = CAST(@RetryBaseSeconds AS BIGINT)
                                * POWER(CAST(4 AS BIGINT), IIF(@Attempts > 10, 10, @Attempts - 1));
                            SET @Timeout = CAST(IIF(@Backoff > @RetryMaxSeconds, @RetryMaxSeconds, @Backoff) AS INT);

                            UPDATE delay.Task
                            SET
                                TaskState = N'Retrying',
                                NextRunAtUtc = DATEADD(SECOND, @Timeout, @Now),
                                LeaseUntilUtc = NULL,
                                LastErrorNumber = 50331,
                                LastErrorMessage = @ErrorMessage
                            WHERE TaskID = @TaskID;

                            BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;

                            INSERT INTO delay.Log (
                                TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                            )
                            VALUES (@TaskID, N'RunnerLost', @TargetName, @Attempts, 50331, @ErrorMessage, @Handle);
                        END;
                        ELSE
                            EXEC delay.FinishTask
                                @SetReceipt = 0,
                                @TaskID = @TaskID,
                                @TaskState = N'Failed',
                                @EventName = N'RunnerLost',
                                @ErrorNumber = 50331,
                                @ErrorMessage = @ErrorMessage;
                    END;
                END;
                ------------------------------------------------------------
                -- 1d. Scheduled or Retrying, on its timer or its DelayRequest
                ------------------------------------------------------------
                ELSE
                BEGIN
                    SET @RemainingMs = DATEDIFF_BIG(MILLISECOND, @Now, @NextRunAtUtc);
                    IF @MessageType = @DialogTimer AND @RemainingMs > @EarlyToleranceMs
                    BEGIN
                        -- A chained timer of a delay longer than one day: re-arm for the rest.
                        SET @Timeout = CASE
                            WHEN @RemainingMs >= CAST(@MaxTimerSeconds AS BIGINT) * 1000 THEN @MaxTimerSeconds
                            ELSE CAST((@RemainingMs + 999) / 1000 AS INT)
                        END;
                        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
                    END;
                    ELSE
                    BEGIN
                        -- Due.  Resolve the name again: the allow-list or the
                        -- procedure (its definition included) may have changed
                        -- since the row was scheduled.
                        SELECT
                            @Refusal = r.RefusalNumber,
                            @RefusalMessage = r.RefusalMessage,
                            @SchemaName = r.SchemaName,
                            @ProcedureName = r.ProcedureName
                        FROM delay.ResolveTarget(@TargetName) AS r;

                        -- The values are read at run time, by the row's ID.
                        -- A value longer than the contract's 200 characters
                        -- is refused, never cut (an adopted table may have
                        -- wider columns, or rows loaded without the trigger).
                        SELECT
                            @SPName = CAST(p.F108211 AS NVARCHAR(200)),
                            @Param1 = CAST(p.F108212 AS NVARCHAR(200)),
                            @Param2 = CAST(p.F108213 AS NVARCHAR(200)),
                            @Param3 = CAST(p.F108214 AS NVARCHAR(200)),
                            @Param4 = CAST(p.F108215 AS NVARCHAR(200)),
                            @Param5 = CAST(p.F108216 AS NVARCHAR(200)),
                            @TooLong = CASE
                                WHEN
                                    LEN(CAST(p.F108211 AS NVARCHAR(4000)) + N'.') > 201
                                    OR LEN(CAST(p.F108212 AS NVARCHAR(MAX)) + N'.') > 201
                                    OR LEN(CAST(p.F108213 AS NVARCHAR(MAX)) + N'.') > 201
                                    OR LEN(CAST(p.F108214 AS NVARCHAR(MAX)) + N'.') > 201
                                    OR LEN(CAST(p.F108215 AS NVARCHAR(MAX)) + N'.') > 201
                                    OR LEN(CAST(p.F108216 AS NVARCHAR(MAX)) + N'.') > 201
                                    THEN 1
                                ELSE 0
                            END
                        FROM dbo.tabDIYTable12402 AS p
                        WHERE p.ID = @TaskID;

                        IF @@ROWCOUNT = 0
                            EXEC delay.FinishTask
                                @SetReceipt = 0,
                                @TaskID = @TaskID,
                                @TaskState = N'Cancelled',
                                @EventName = N'Cancelled',
                                @ErrorNumber = 50332,
                                @ErrorMessage = N'the platform row was deleted before the task ran';
                        ELSE IF @Refusal IS NOT NULL OR @TooLong = 1
                        BEGIN
                            IF @Refusal IS NULL
                                SELECT
                                    @Refusal = 50303,
                                    @RefusalMessage = CONCAT(
                                        N'a value F108211-F108216 is longer than the target''s 200 characters; ',
                                        N'refused, not cut'
                                    );
                            EXEC delay.FinishTask
                                @SetReceipt = 0,
                                @TaskID = @TaskID,
                                @TaskState = N'Refused',
                                @EventName = N'Refused',
                                @ErrorNumber = @Refusal,
                                @ErrorMessage = @RefusalMessage;
                        END;
                        ELSE
                        BEGIN
                            -- The run lock is taken here, before this
                            -- transaction commits the task as Running: a
                            -- watchdog that fires between that commit and the
                            -- target must find it held, or it would declare the
                            -- runner lost and start a second run (spin found
                            -- that race: models/delayexec.pml, delay-stale-runner).
                            -- Session-owned, so the COMMIT below keeps it;
                            -- released once, at the end of this pass, or by the
                            -- session's end.
                            SET @LockName = CONCAT(N'mailq-db/delay/task/', @TaskID);
                            EXEC @LockResult = sys.sp_getapplock
                                @Resource = @LockName,
                                @LockMode = N'Exclusive',
                                @LockOwner = N'Session',
                                @LockTimeout = 0;
                            IF @LockResult >= 0
                                SET @LockHeld = 1;

                            IF @LockHeld = 0
                            BEGIN
                                -- A runner of an earlier attempt still holds the
                                -- task: never run it twice at once.  Wait a lease.
                                SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                                BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                                INSERT INTO delay.Log (
                                    TaskID, EventName, TargetName, Attempt, ErrorMessage, ConversationHandle
                                )
                                VALUES (
                                    @TaskID, N'Slow', @TargetName, @Attempts,
                                    N'an earlier run of this task still holds its run lock; '
                                    + N'the next attempt waits a lease',
                                    @Handle
                                );
                            END;
                            ELSE
                            BEGIN
                                SET @Attempt = @Attempts + 1;

                                UPDATE delay.Task
                                SET
                                    TaskState = N'Running',
                                    Attempts = @Attempt,
                                    SchemaName = @SchemaName,
                                    ProcedureName = @ProcedureName,
                                    FirstStartedAtUtc = ISNULL(FirstStartedAtUtc, @Now),
                                    LastStartedAtUtc = @Now,
                                    NextRunAtUtc = NULL,
                                    LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now)
                                WHERE TaskID = @TaskID;

                                -- The watchdog: on the task's own conversation
                                -- (for a DelayRequest it was set above, before
                                -- the row lock; setting it again is harmless).
                                SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                                BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                                SET @Run = 1;
                            END;
                        END;
                    END;
                END;
            END;

            COMMIT TRANSACTION;
            SET @Step1Committed = 1;
            -- The redelivered message went through: a later message of the
            -- same conversation (the next timer of a chained delay, a lease,
            -- a retry) gets its own redelivery on a deadlock, as the header
            -- says ("first time for this message"), instead of the recovery.
            IF @RedeliveredHandle = @Handle
                SET @RedeliveredHandle = NULL;
        END TRY
        BEGIN CATCH
            SELECT @ErrorNumber = ERROR_NUMBER(), @ErrorMessage = ERROR_MESSAGE(), @Run = 0;
            -- The message goes back to the queue: one rollback of it.  (A run
            -- lock taken in this step survives the rollback, being
            -- session-owned; it is released once, at the end of this pass.)
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;

            IF @Handle IS NULL
            BEGIN
                -- Nothing received: the queue itself failed (e.g. disabled,
                -- error 9617).  Say so in the error log, and stop; activation
                -- starts readers again once the queue is enabled.
                -- N'%s': the text is an argument, so a % in an error message
                -- is never read as a format specification.
                SET @LogText = CONCAT(
                    N'mailq-db dbo.ProcessDelayQueue: RECEIVE from dbo.DelayServiceQueue failed (error ',
                    @ErrorNumber, N': ', @ErrorMessage, N'); the reader stops. See delay.Health.'
                );
                RAISERROR (N'%s', 16, 1, @LogText);
                SET @Stop = 1;
            END;
            ELSE IF @ErrorNumber IN (1205, 50350) AND (@RedeliveredHandle IS NULL OR @RedeliveredHandle <> @Handle)
                -- Deadlock victim: transient.  One ordinary redelivery: the
                -- message is back on the queue and the next RECEIVE gets it.
                SET @RedeliveredHandle = @Handle;
            ELSE
                SET @Recover = 1;
        END CATCH;

        --==================================================================
        -- RECOVERY: only after a failed step 1.  Minimal on purpose: it does
        -- nothing that the failed step 1 did (no delay.FinishTask, no
        -- delay.Task, no platform table), so the failure cannot repeat here.
        --==================================================================
        IF @Recover = 1
        BEGIN
            BEGIN TRY
                BEGIN TRANSACTION;

                -- RECEIVE ... WHERE conversation_handle = @Handle takes only a
                -- message of this conversation (RECEIVE, WHERE clause:
                -- https://learn.microsoft.com/en-us/sql/t-sql/statements/receive-transact-sql).
                -- Another reader idle in WAITFOR (RECEIVE) may have taken it
                -- since our rollback: then nothing is received, and that
                -- reader owns the message.
                RECEIVE TOP (1) @Body = message_body
                FROM dbo.DelayServiceQueue
                WHERE conversation_handle = @Handle;

                IF @@ROWCOUNT > 0
                BEGIN
                    INSERT INTO delay.Incident (
                        ConversationHandle, MessageType, TaskID, ErrorNumber, ErrorMessage
                    )
                    VALUES (@Handle, @MessageType, @TaskID, @ErrorNumber, LEFT(@ErrorMessage, 4000));

                    END CONVERSATION @Handle;
                    SET @Recovered = 1;
                END;

                COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- Twice in a row: stop this reader rather than spin, and say
                -- so where a DBA looks.  (Not WITH LOG: that needs sysadmin or
                -- ALTER TRACE (RAISERROR, WITH LOG:
                -- https://learn.microsoft.com/en-us/sql/t-sql/language-elements/raiserror-transact-sql),
                -- which the activation's dbo impersonation does not carry in a
                -- database not marked trusted, so it would fail with 2778
                -- and log nothing; a reader's RAISERROR output is written to
                -- the error log by activation itself:
                -- https://learn.microsoft.com/en-us/previous-versions/sql/sql-server-2008-r2/ms171585(v=sql.105))
                SET @LogText = CONCAT(
                    N'mailq-db dbo.ProcessDelayQueue: the recovery of a ', @MessageType, N' message on conversation ',
                    @Handle, N' failed (error ', @StepErrorNumber, N': ', @StepErrorMessage,
                    N') after step 1 failed (error ', @ErrorNumber, N': ', @ErrorMessage, N'); the reader stops.'
                );
                RAISERROR (N'%s', 16, 1, @LogText);
                SET @Stop = 1;
            END CATCH;
        END;

        --==================================================================
        -- RECOVERY FOLLOW-UP: outside any RECEIVE transaction.  A task still
        -- waiting on the conversation the recovery ended would never fire:
        -- fail it (receipt 3).  A Running task is left to its runner's step 3.
        --==================================================================
        IF @Recovered = 1 AND @TaskID IS NOT NULL
        BEGIN
            BEGIN TRY
                BEGIN TRANSACTION;
                -- The conversation is gone (ended above), so the task row is
                -- the first lock here.
                SET @TaskState = NULL;
                SELECT @TaskState = t.TaskState
                FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
                WHERE t.TaskID = @TaskID AND t.ConversationHandle = @Handle;

                IF @TaskState IN (N'Scheduled', N'Retrying')
                BEGIN
                    SET @StepErrorMessage = CONCAT(
                        N'dbo.ProcessDelayQueue could not process a ', @MessageType,
                        N' message of this task (error ', @ErrorNumber, N': ', LEFT(@ErrorMessage, 3000),
                        N'); the message was recorded in delay.Incident and its conversation ended'
                    );
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'BrokerError',
                        @ErrorNumber = 50346,
                        @ErrorMessage = @StepErrorMessage;
                END;

                COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- No RECEIVE in this transaction: its rollback never counts
                -- against the queue.  delay.Reconcile finds the task later.
                SET @LogText = CONCAT(
                    N'mailq-db dbo.ProcessDelayQueue: task ', @TaskID,
                    N' could not be failed after its message was recovered (error ', @StepErrorNumber, N': ',
                    @StepErrorMessage, N'); delay.Reconcile will find it.'
                );
                RAISERROR (N'%s', 10, 1, @LogText);
            END CATCH;
        END;

        --==================================================================
        -- STEP 2: run the target in its own transaction.
        --==================================================================
        IF @Run = 1
        BEGIN
            -- This session holds the task's run lock since step 1 (session-owned:
            -- it survives the target's COMMIT or ROLLBACK).
            SELECT @ErrorNumber = NULL, @ErrorMessage = NULL, @Retryable = 1;

            -- Built from the catalog's names (delay.ResolveTarget checked the
            -- allow-list, the object's identity and its pinned definition),
            -- each part QUOTENAMEd; the six values are parameters, never part
            -- of the text.  The SET options apply to the target only: a SET in
            -- a batch run by sp_executesql reverts when that batch returns
            -- (https://learn.microsoft.com/en-us/sql/t-sql/statements/set-statements-transact-sql).
            -- The lock timeout is an INT from delay.Setting, so its text is
            -- digits only.
            SET @Sql = CONCAT(
                N'SET DEADLOCK_PRIORITY NORMAL; SET XACT_ABORT OFF; SET LOCK_TIMEOUT ',
                ISNULL(@TargetLockTimeoutMs, -1), N'; ',
                N'EXEC ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@ProcedureName),
                N' @SPName = @SPName, @Param1 = @Param1, @Param2 = @Param2,',
                N' @Param3 = @Param3, @Param4 = @Param4, @Param5 = @Param5;'
            );

            BEGIN TRY
                BEGIN TRANSACTION;

                EXEC sys.sp_executesql
                    @Sql,
                    @ParameterList,
                    @SPName = @SPName,
                    @Param1 = @Param1,
                    @Param2 = @Param2,
                    @Param3 = @Param3,
                    @Param4 = @Param4,
                    @Param5 = @Param5;

                IF @@TRANCOUNT > 1
                BEGIN
                    -- Left a transaction of its own open (normally 266 is raised first).
                    SELECT
                        @ErrorNumber = 50335,
                        @ErrorMessage = CONCAT(N'the target left ', @@TRANCOUNT - 1, N' transaction(s) open');
                    ROLLBACK TRANSACTION;
                END;
                ELSE IF @@TRANCOUNT = 1
                    COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                SELECT
                    @ErrorNumber = ERROR_NUMBER(),
                    @ErrorMessage = ERROR_MESSAGE(),
                    @TargetTranCount = @@TRANCOUNT;
                -- Doomed (-1) or not (1): the target's work is undone as a whole.
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- 266 with more than our one transaction open: the target
                -- left one of its own open; all of it was rolled back just
                -- now, so it is retried (50335).  266 with none open: the
                -- target committed or rolled back the transaction opened for
                -- it; what it did may be committed, so it is not run again.
                IF @ErrorNumber = 266 AND @TargetTranCount > 1
                    SELECT
                        @ErrorNumber = 50335,
                        @ErrorMessage = CONCAT(
                            N'the target left ', @TargetTranCount - 1, N' transaction(s) open; rolled back: ',
                            @ErrorMessage
                        );
                ELSE IF @ErrorNumber = 266
                    SELECT
                        @Retryable = 0,
                        @ErrorMessage = CONCAT(
                            N'the target committed or rolled back the transaction opened for it ',
                            N'(its work may be committed; not retried): ', @ErrorMessage
                        );
            END CATCH;

            -- The reader's own settings, re-asserted after the target.
            SET XACT_ABORT ON;
            SET DEADLOCK_PRIORITY HIGH;
            SET LOCK_TIMEOUT -1;

            --==============================================================
            -- STEP 3: record the outcome in a new transaction (retried on
            -- deadlock).
            --==============================================================
            SELECT @Recorded = 0, @Try = 0;
            WHILE @Recorded = 0 AND @Try < 3
            BEGIN
                SET @Try += 1;
                BEGIN TRY
                    BEGIN TRANSACTION;

                    -- Conversation group first (BEGIN CONVERSATION TIMER locks
                    -- it), then the task row: the lock order of step 1.  It
                    -- also keeps the watchdog armed until the outcome is
                    -- committed.  A conversation ended meanwhile (a recovery,
                    -- NEW_BROKER) has no group to lock: the row comes first.
                    SET @EndpointOpen = CASE
                        WHEN EXISTS (
                            SELECT 1 FROM sys.conversation_endpoints AS e
                            WHERE e.conversation_handle = @TaskHandle AND e.state NOT IN ('CD', 'ER', 'DI')
                        ) THEN 1
                        ELSE 0
                    END;
                    SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                    IF @EndpointOpen = 1
                        BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                    SET @TaskState = NULL;
                    -- UPDLOCK, ROWLOCK: as in step 1.
                    SELECT
                        @TaskState = t.TaskState,
                        @Attempts = t.Attempts
                    FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
                    WHERE t.TaskID = @TaskID;

                    SET @Now = SYSUTCDATETIME();

                    IF @TaskState IS NULL OR @TaskState <> N'Running' OR @Attempts <> @Attempt
                    BEGIN
                        -- Finished meanwhile (a broker Error) or the row is gone: keep that outcome.
                        IF @ErrorNumber IS NOT NULL
                            INSERT INTO delay.Log (
                                TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                            )
                            VALUES (
                                @TaskID, N'Failed', @TargetName, @Attempt, @ErrorNumber, @ErrorMessage, @TaskHandle
                            );
                    END;
                    ELSE IF @ErrorNumber IS NULL
                        EXEC delay.FinishTask @SetReceipt = 0, @TaskID = @TaskID, @TaskState = N'Done';
                    ELSE IF @Retryable = 1 AND @Attempt < @MaxAttempts AND @EndpointOpen = 1
                    BEGIN
                        SET @Backoff = CAST(@RetryBaseSeconds AS BIGINT)
                            * POWER(CAST(4 AS BIGINT), IIF(@Attempt > 10, 10, @Attempt - 1));
                        SET @Timeout = CAST(IIF(@Backoff > @RetryMaxSeconds, @RetryMaxSeconds, @Backoff) AS INT);

                        UPDATE delay.Task
                        SET
                            TaskState = N'Retrying',
                            NextRunAtUtc = DATEADD(SECOND, @Timeout, @Now),
                            LeaseUntilUtc = NULL,
                            LastErrorNumber = @ErrorNumber,
                            LastErrorMessage = @ErrorMessage
                        WHERE TaskID = @TaskID;

                        -- Replaces the lease: the retry is a new timer on the same conversation.
                        BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                        INSERT INTO delay.Log (
                            TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                        )
                        VALUES (@TaskID, N'Failed', @TargetName, @Attempt, @ErrorNumber, @ErrorMessage, @TaskHandle);
                    END;
                    ELSE
                        EXEC delay.FinishTask
                            @SetReceipt = 0,
                            @TaskID = @TaskID,
                            @TaskState = N'Failed',
                            @EventName = N'GaveUp',
                            @ErrorNumber = @ErrorNumber,
                            @ErrorMessage = @ErrorMessage;

                    COMMIT TRANSACTION;
                    SET @Recorded = 1;
                END TRY
                BEGIN CATCH
                    SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
                    IF XACT_STATE() <> 0
                        ROLLBACK TRANSACTION;
                    -- 1205: deadlock victim, try again.  Anything else: stop
                    -- trying; the lease timer (or delay.Reconcile) finds the
                    -- task Running with no runner.
                    IF @StepErrorNumber <> 1205 OR @Try >= 3
                    BEGIN
                        SET @Try = 3;
                        BEGIN TRY
                            INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage)
                            VALUES (
                                @TaskID, N'BrokerError', @TargetName, @Attempt, @StepErrorNumber,
                                CONCAT(
                                    N'the outcome of attempt ', @Attempt, N' could not be recorded: ', @StepErrorMessage
                                )
                            );
                        END TRY
                        BEGIN CATCH
                            -- Best effort: the lease timer still covers the task.
                            SET @Recorded = 0;
                        END CATCH;
                    END;
                END CATCH;
            END;
        END;

        --==================================================================
        -- RECEIPT: a task that step 1 or step 3 made final gets its receipt
        -- here, in a statement of its own after that COMMIT: no transaction
        -- that RECEIVEd ever writes the platform's table, and a failure there
        -- (a constraint or trigger of the platform's) can never undo the
        -- recorded outcome of a target that ran (step 3 rolled back would
        -- leave the task Running, and the watchdog would run it again).  The
        -- task is still final in delay.Task; delay.Reconcile repairs the
        -- receipt later.
        --==================================================================
        IF @TaskID IS NOT NULL AND ((@Step1Committed = 1 AND @Run = 0) OR @Recorded = 1)
        BEGIN
            BEGIN TRY
                UPDATE p
                SET F108219 = CASE t.TaskState
                    WHEN N'Done' THEN 1
                    WHEN N'Refused' THEN 2
                    WHEN N'Failed' THEN 3
                    WHEN N'Cancelled' THEN 4
                    ELSE 0
                END
                FROM dbo.tabDIYTable12402 AS p
                INNER JOIN delay.Task AS t ON p.ID = t.TaskID
                WHERE
                    p.ID = @TaskID
                    AND t.TaskState IN (N'Done', N'Refused', N'Failed', N'Cancelled')
                    AND ISNULL(p.F108219, 0) = 0;
            END TRY
            BEGIN CATCH
                SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                SET @LogText = CONCAT(
                    N'mailq-db dbo.ProcessDelayQueue: the receipt of task ', @TaskID, N' could not be written (error ',
                    @StepErrorNumber, N': ', @StepErrorMessage, N'); delay.Reconcile repairs it.'
                );
                RAISERROR (N'%s', 10, 1, @LogText);
            END CATCH;
        END;

        --==================================================================
        -- RELEASE: the run lock, exactly once per pass that took it.  The
        -- flag is cleared first, so no path can release it twice (a second
        -- sp_releaseapplock of a lock not held raises error 1223).
        --==================================================================
        IF @LockHeld = 1
        BEGIN
            SET @LockHeld = 0;
            EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';
        END;
    END;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS delay.RecordOutcome;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
delay.FinishTask: moves a task to a final state, sets the platform's receipt,
logs the event and ends the task's conversation (which also drops its timer).
Parameters:  @TaskID       BIGINT, required
             @TaskState    NVARCHAR(16): Done, Failed, Refused or Cancelled
             @EventName    NVARCHAR(16) = NULL: the delay.Log event to write
                           (NULL writes none, e.g. for Done)
             @ErrorNumber  INT = NULL, @ErrorMessage NVARCHAR(4000) = NULL:
                           stored as the task's last error and in the log row
             @SetReceipt   BIT = 1: 0 leaves dbo.tabDIYTable12402 alone; the
                           caller writes the receipt after its COMMIT.  Every
                           transaction that RECEIVEd passes 0: the platform's
                           table may carry constraints or triggers we do not
                           own, and a failure there must never roll back a
                           RECEIVE (delay.Reconcile repairs a receipt that
                           could not be written).
Receipt:     Done 1, Refused 2, Failed 3, Cancelled 4 (dbo.tabDIYTable12402.F108219)
Errors:      50399 called outside a transaction or with an unknown state (a bug)
Transaction: joins the caller's, which must exist: the state change and the
             END CONVERSATION commit or roll back together
Internal:    called by dbo.ProcessDelayQueue and dbo.CancelDelayExecution (both
             run as dbo); no role is granted EXECUTE.
Example:     EXEC delay.FinishTask @TaskID = 42, @TaskState = N'Done';
*/
CREATE OR ALTER PROCEDURE delay.FinishTask
    @TaskID BIGINT,
    @TaskState NVARCHAR(16),
    @EventName NVARCHAR(16) = NULL,
    @ErrorNumber INT = NULL,
    @ErrorMessage NVARCHAR(4000) = NULL,
    @SetReceipt BIT = 1
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @@TRANCOUNT = 0 OR @TaskState IS NULL
        OR @TaskState NOT IN (N'Done', N'Failed', N'Refused', N'Cancelled')
    BEGIN
        SET @Msg = CONCAT(
            N'delay.FinishTask needs its caller''s transaction and a final @TaskState; got @@TRANCOUNT = ',
            @@TRANCOUNT, N', @TaskState = ', ISNULL(@TaskState, N'NULL'), N'.'
        );
        THROW 50399, @Msg, 1;
    END;

    DECLARE
        @Handle UNIQUEIDENTIFIER,
        @TargetName NVARCHAR(400),
        @Attempts INT;

    UPDATE delay.Task
    SET
        TaskState = @TaskState,
        FinishedAtUtc = SYSUTCDATETIME(),
        NextRunAtUtc = NULL,
        LeaseUntilUtc = NULL,
        LastErrorNumber = ISNULL(@ErrorNumber, LastErrorNumber),
        LastErrorMessage = ISNULL(@ErrorMessage, LastErrorMessage),
        @Handle = ConversationHandle,
        @TargetName = TargetName,
        @Attempts = Attempts
    WHERE TaskID = @TaskID;

    -- The receipt is set by the row's ID, never by matching parameter values
    -- (the source design's join on F108211-F108216 missed NULLs and marked
    -- rows with equal parameters together).
    IF ISNULL(@SetReceipt, 1) = 1
        UPDATE dbo.tabDIYTable12402
        SET F108219 = CASE @TaskState
            WHEN N'Done' THEN 1
            WHEN N'Refused' THEN 2
            WHEN N'Failed' THEN 3
            WHEN N'Cancelled' THEN 4
        END
        WHERE ID = @TaskID;

    IF @EventName IS NOT NULL
        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle)
        VALUES (@TaskID, @EventName, @TargetName, @Attempts, @ErrorNumber, @ErrorMessage, @Handle);

    -- Every task's conversation ends here, once: no endpoint is left behind.
    -- Ending the initiator side also discards its pending timer.  An endpoint
    -- that no longer exists (ALTER DATABASE ... SET NEW_BROKER removes every
    -- conversation without notice) or is already closed is not ended again:
    -- END CONVERSATION needs an existing conversation
    -- (https://learn.microsoft.com/en-us/sql/t-sql/statements/end-conversation-transact-sql).
    IF @Handle IS NOT NULL AND EXISTS (
        SELECT 1 FROM sys.conversation_endpoints AS e
        WHERE e.conversation_handle = @Handle AND e.state <> 'CD'
    )
        END CONVERSATION @Handle;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0010';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Activation INT = CAST(SESSION_CONTEXT(N'mailq_db.activation') AS INT);
IF @Activation IS NOT NULL AND EXISTS (
    SELECT 1 FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') AND q.activation_procedure IS NOT NULL)
BEGIN
    IF @Activation = 1
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON);
    ELSE
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);
END;
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = NULL;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0010 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0009' WHERE dbo.mailq_alembic_version.version_num = '0010';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0009 -> 0008

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0009')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0009; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.SendDbMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.SendDbMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertDbMailProfile') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertDbMailProfile FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.DeleteDbMailProfile') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.DeleteDbMailProfile FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertDbMailProfileAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertDbMailProfileAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.DeleteDbMailProfileAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.DeleteDbMailProfileAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertDbMailPrincipalProfile') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertDbMailPrincipalProfile FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.DeleteDbMailPrincipalProfile') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.DeleteDbMailPrincipalProfile FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_allitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_allitems FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_sentitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_sentitems FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_unsentitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_unsentitems FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_faileditems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_faileditems FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_event_log') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_event_log FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.SendDbMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.SendDbMail FROM MailqDbMailUser;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_allitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_allitems FROM MailqDbMailUser;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_sentitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_sentitems FROM MailqDbMailUser;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_unsentitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_unsentitems FROM MailqDbMailUser;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_faileditems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_faileditems FROM MailqDbMailUser;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.sysmail_event_log') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_event_log FROM MailqDbMailUser;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.DeleteDbMailPrincipalProfile;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.UpsertDbMailPrincipalProfile;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.DeleteDbMailProfileAccount;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.UpsertDbMailProfileAccount;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.DeleteDbMailProfile;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.UpsertDbMailProfile;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.SendDbMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.RenderDbMailQuery;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.sysmail_event_log;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.sysmail_faileditems;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.sysmail_unsentitems;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.sysmail_sentitems;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.sysmail_allitems;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.DbMailPrincipalProfile') IS NOT NULL
    DROP INDEX IF EXISTS UX_DbMailPrincipalProfile_Default ON mailq.DbMailPrincipalProfile;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.DbMailItem;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.DbMailPrincipalProfile;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.DbMailProfileAccount;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.DbMailAccount;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.DbMailProfile;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF DATABASE_PRINCIPAL_ID(N'MailqDbMailUser') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqDbMailUser DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqDbMailUser');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqDbMailUser;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0009';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0009 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0008' WHERE dbo.mailq_alembic_version.version_num = '0009';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0008 -> 0007

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0008')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0008; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RecordRecipientOutcomes') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetRecipientOutcomes') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetRecipientOutcomes FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RecordRecipientOutcomes') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetRecipientOutcomes') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetRecipientOutcomes FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RecipientOutcomes') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.RecipientOutcomes FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.GetRecipientOutcomes;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.RecordRecipientOutcomes;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.RecipientOutcomes;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.MailRecipientOutcome;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0008';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0008 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0007' WHERE dbo.mailq_alembic_version.version_num = '0008';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0007 -> 0006

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0007')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0007; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.EnqueueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ClaimMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ExtendLease') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ExtendLease FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ReleaseMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ReleaseMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkSent') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkSent FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkFailed') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkFailed FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RequeueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RequeueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.CancelMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.CancelMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.PurgeMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.PurgeMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertSendingAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UnblockSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UnblockSendingAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.BindApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.BindApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UnbindApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UnbindApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MoveBodiesOutOfRow') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MoveBodiesOutOfRow FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetQueueStats') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetQueueStats FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetInstallationHealth') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetInstallationHealth FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.QueueCountsByStatus') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.QueueCountsByStatus FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.OldestDueMail') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.OldestDueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ThroughputPerHour') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.ThroughputPerHour FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RecentFailures') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.RecentFailures FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
Grants of role MailqAdmin: every public mailq procedure and the reporting
views (views are read-only reports, not table rights).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RequeueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.CancelMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.PurgeMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UnblockSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetQueueStats TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.QueueCountsByStatus TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.OldestDueMail TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.ThroughputPerHour TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecentFailures TO MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ClaimMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimMail FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ExtendLease') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ExtendLease FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ReleaseMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ReleaseMail FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkSent') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkSent FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkFailed') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkFailed FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetInstallationHealth') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetInstallationHealth FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
Grants of role MailqSender (sender workers): claim, extend, release and
acknowledge mail, and read the installation health for `mailq-db doctor`.
*/
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.EnqueueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMail FROM MailqEnqueuer;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
Grants of role MailqEnqueuer: enqueue mail, nothing else.  Object-level
grants (not SCHEMA::mailq) so that internal procedures such as
mailq.LockLeasedMail stay out of reach.
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqEnqueuer;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.GetInstallationHealth: one row per installation check, for
`mailq-db doctor`.  Reads only catalog views and the queue; changes nothing.
Parameters:  none.
Result set:  Area, CheckName, Status ('OK', 'WARN' or 'FAIL'), Detail, Fix
             (what to do when Status is not OK).  Checks: server version and
             edition; compatibility level (>= 130); READ_COMMITTED_SNAPSHOT;
             deployed schema revision; Service Broker and dbo.DelayServiceQueue;
             the caller's roles and EXECUTE permissions; expired leases not yet
             reclaimed; failures of the last 24 hours; blocked accounts; default account.
Errors:      none of its own.
Transaction: reads only.
Example:     EXEC mailq.GetInstallationHealth;
*/
CREATE OR ALTER PROCEDURE mailq.GetInstallationHealth
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Check TABLE (
        Position INT IDENTITY (1, 1) NOT NULL PRIMARY KEY,
        Area NVARCHAR(30) NOT NULL,
        CheckName NVARCHAR(60) NOT NULL,
        Status NVARCHAR(4) NOT NULL,
        Detail NVARCHAR(4000) NULL,
        Fix NVARCHAR(4000) NULL
    );

    DECLARE @Compat INT, @Rcsi BIT, @Broker BIT;
    SELECT
        @Compat = d.compatibility_level,
        @Rcsi = d.is_read_committed_snapshot_on,
        @Broker = d.is_broker_enabled
    FROM sys.databases AS d
    WHERE d.database_id = DB_ID();

    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    VALUES
    (
        N'Server', N'Version', N'OK',
        LEFT(REPLACE(@@VERSION, NCHAR(10), N' '), 300), NULL
    ),
    (
        N'Server', N'Edition', N'OK',
        CONCAT(CAST(SERVERPROPERTY(N'Edition') AS NVARCHAR(128)), N' (engine edition ',
            CAST(SERVERPROPERTY(N'EngineEdition') AS NVARCHAR(10)), N')'), NULL
    ),
    (
        N'Database', N'CompatibilityLevel', IIF(@Compat >= 130, N'OK', N'FAIL'),
        CONCAT(N'compatibility level ', @Compat),
        IIF(@Compat >= 130, NULL, CONCAT(N'ALTER DATABASE ', QUOTENAME(DB_NAME()), N' SET COMPATIBILITY_LEVEL = 150;'))
    ),
    (
        N'Database', N'ReadCommittedSnapshot', IIF(@Rcsi = 1, N'OK', N'WARN'),
        IIF(
            @Rcsi = 1, N'READ_COMMITTED_SNAPSHOT is on',
            N'READ_COMMITTED_SNAPSHOT is off: report readers and writers can block each other'
        ),
        IIF(
            @Rcsi = 1, NULL,
            CONCAT(
                N'In a maintenance window: ALTER DATABASE ', QUOTENAME(DB_NAME()),
                N' SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE;'
            )
        )
    ),
    (
        N'Broker', N'ServiceBrokerEnabled', IIF(@Broker = 1, N'OK', N'WARN'),
        IIF(
            @Broker = 1, N'Service Broker is enabled',
            N'Service Broker is disabled: delayed execution cannot run (the mail queue can)'
        ),
        IIF(
            @Broker = 1, NULL,
            CONCAT(
                N'Needs exclusive access: ALTER DATABASE ', QUOTENAME(DB_NAME()),
                N' SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE; (rolls back and disconnects other sessions)'
            )
        )
    );

    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT TOP (1)
        N'Schema', N'Revision', N'OK', v.version_num, NULL
    FROM dbo.mailq_alembic_version AS v;
    IF @@ROWCOUNT = 0
        INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
        VALUES (N'Schema', N'Revision', N'FAIL', N'no revision recorded', N'mailq-db deploy --url ...');

    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Broker',
        N'DelayServiceQueue',
        IIF(q.is_receive_enabled = 1 AND q.is_activation_enabled = 1, N'OK', N'FAIL'),
        CONCAT(N'receive enabled: ', q.is_receive_enabled, N', activation enabled: ', q.is_activation_enabled,
            N', max readers: ', q.max_readers),
        IIF(
            q.is_receive_enabled = 1 AND q.is_activation_enabled = 1, NULL,
            N'ALTER QUEUE dbo.DelayServiceQueue WITH STATUS = ON, ACTIVATION (STATUS = ON); '
            + N'then read the delayed-execution failure log (docs/delayed-execution.md)'
        )
    FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue');

    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Security',
        N'RoleMembership',
        N'OK',
        CONCAT(
            N'user ', QUOTENAME(USER_NAME()), N'; member of: ',
            COALESCE(
                STUFF(
                    CONCAT(
                        IIF(IS_ROLEMEMBER(N'MailqEnqueuer') = 1, N', MailqEnqueuer', N''),
                        IIF(IS_ROLEMEMBER(N'MailqSender') = 1, N', MailqSender', N''),
                        IIF(IS_ROLEMEMBER(N'MailqAdmin') = 1, N', MailqAdmin', N''),
                        IIF(IS_ROLEMEMBER(N'MailqDelayCaller') = 1, N', MailqDelayCaller', N''),
                        IIF(IS_ROLEMEMBER(N'db_owner') = 1, N', db_owner', N'')
                    ), 1, 2, N''
                ),
                N'none'
            )
        ),
        NULL;

    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Security',
        CONCAT(N'Execute ', p.ProcName),
        IIF(HAS_PERMS_BY_NAME(p.ProcName, N'OBJECT', N'EXECUTE') = 1, N'OK', N'WARN'),
        CONCAT(
            p.ProcName,
            IIF(HAS_PERMS_BY_NAME(p.ProcName, N'OBJECT', N'EXECUTE') = 1, N' may be executed', N' may not be executed')
        ),
        IIF(
            HAS_PERMS_BY_NAME(p.ProcName, N'OBJECT', N'EXECUTE') = 1, NULL,
            CONCAT(N'ALTER ROLE ', p.RoleName, N' ADD MEMBER ', QUOTENAME(USER_NAME()), N'; (if this login needs it)')
        )
    FROM (
        VALUES
        (N'mailq.EnqueueMail', N'MailqEnqueuer'),
        (N'mailq.ClaimMail', N'MailqSender'),
        (N'mailq.MarkSent', N'MailqSender'),
        (N'mailq.GetQueueStats', N'MailqAdmin')
    ) AS p(ProcName, RoleName);

    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Queue',
        N'ExpiredLeases',
        IIF(COUNT_BIG(*) = 0, N'OK', N'WARN'),
        CONCAT(COUNT_BIG(*), N' mail(s) in Sending whose lease expired and that no worker reclaimed yet'),
        IIF(COUNT_BIG(*) = 0, NULL, N'Start a worker (mailq-db worker); a worker that died leaves these behind')
    FROM mailq.MailQueue AS q
    WHERE q.Status = N'Sending' AND q.VisibleAtUtc < @Now;

    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Queue',
        N'FailedLast24Hours',
        IIF(COUNT_BIG(*) = 0, N'OK', N'WARN'),
        CONCAT(COUNT_BIG(*), N' mail(s) Failed in the last 24 hours'),
        IIF(COUNT_BIG(*) = 0, NULL, N'Read them with mailq-db stats; requeue with mailq.RequeueMail once fixed')
    FROM mailq.MailQueue AS q
    WHERE q.Status = N'Failed' AND q.DateProcessed >= DATEADD(HOUR, -24, @Now);

    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Accounts',
        CONCAT(N'Blocked ', a.AccountName),
        N'WARN',
        CONCAT(N'blocked until ', CONVERT(NVARCHAR(30), a.BlockedUntilUtc, 126), N' UTC: ', LEFT(a.BlockReason, 300)),
        CONCAT(N'Wait, or clear it: EXEC mailq.UnblockSendingAccount @AccountName = N''', a.AccountName, N''';')
    FROM mailq.SendingAccount AS a
    WHERE a.BlockedUntilUtc > @Now;

    IF NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.IsDefault = 1)
        INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
        VALUES (
            N'Accounts', N'DefaultAccount', N'WARN', N'no default sending account: EnqueueMail needs @AccountName',
            N'EXEC mailq.UpsertSendingAccount @AccountName = N''...'', @DefaultFromAddress = N''...'', @IsDefault = 1;'
        );

    SELECT
        c.Area,
        c.CheckName,
        c.Status,
        c.Detail,
        c.Fix
    FROM @Check AS c
    ORDER BY c.Position;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.GetQueueStats: the reporting views in one call (for `mailq-db stats`).
Parameters:  @RecentFailures INT 1-1000, default 20: rows of result set 4.
Result sets: 1. Status, AccountName, MailCount           (mailq.QueueCountsByStatus)
             2. AccountName, OldestDueUtc, OldestDueAgeSeconds, DueCount (mailq.OldestDueMail)
             3. HourUtc, AccountName, Sent, Failed       (mailq.ThroughputPerHour, last 24 h)
             4. ID, AttemptNo, AccountName, Status, Outcome, SmtpCode, LastError,
                DateProcessed                            (mailq.RecentFailures, newest first)
Errors:      50146 @RecentFailures out of range.
Transaction: reads only.
Example:     EXEC mailq.GetQueueStats @RecentFailures = 10;
*/
CREATE OR ALTER PROCEDURE mailq.GetQueueStats
    @RecentFailures INT = 20
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

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

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.MoveBodiesOutOfRow;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.UnbindApplication;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.BindApplication;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.UpsertApplication: registers an application name that mails may carry
(@AppName of EnqueueMail) and isolated workers may claim by, or changes its
description.
Parameters:  @AppName NVARCHAR(128), required; @Description NVARCHAR(400), optional.
Result set:  none.
Errors:      50145 @AppName missing; 50103 a value over its size.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.UpsertApplication @AppName = N'billing', @Description = N'Invoices';
*/
CREATE OR ALTER PROCEDURE mailq.UpsertApplication
    @AppName NVARCHAR(4000),
    @Description NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    IF NULLIF(LTRIM(RTRIM(@AppName)), N'') IS NULL
        THROW 50145, N'@AppName is required.', 1;
    IF LEN(@AppName) > 128 OR LEN(@Description) > 400
        THROW 50103, N'@AppName (128) or @Description (400) is over its size.', 1;

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION UpsertApplication;

        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race between two callers.
        IF EXISTS (SELECT 1 FROM mailq.Application AS p WITH (UPDLOCK, HOLDLOCK) WHERE p.AppName = @AppName)
            UPDATE p
            SET p.Description = @Description
            FROM mailq.Application AS p
            WHERE p.AppName = @AppName;
        ELSE
            INSERT INTO mailq.Application (AppName, Description)
            VALUES (@AppName, @Description);

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION UpsertApplication;
        THROW;
    END CATCH;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.UnblockSendingAccount: clears an account's BlockedUntilUtc (set by
MarkFailed @Disposition = 'Wait'), e.g. once the provider lifted a lock early.
Parameters:  @AccountName NVARCHAR(128), required.
Result set:  none.
Errors:      50142 @AccountName missing; 50114 unknown account.
Transaction: a single statement; joins the caller's if any.
Example:     EXEC mailq.UnblockSendingAccount @AccountName = N'qq';
*/
CREATE OR ALTER PROCEDURE mailq.UnblockSendingAccount
    @AccountName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;

    UPDATE a
    SET
        a.BlockedUntilUtc = NULL,
        a.BlockReason = NULL
    FROM mailq.SendingAccount AS a
    WHERE a.AccountName = @AccountName;

    IF @@ROWCOUNT = 0
    BEGIN
        SET @Msg = CONCAT(N'@AccountName ''', LEFT(@AccountName, 128), N''' is not a sending account.');
        THROW 50114, @Msg, 1;
    END;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.UpsertSendingAccount: creates a sending account or changes its
settings (and creates its rate budget row).  SMTP host and credentials are
not stored: the worker's configuration maps the account name to them.
Parameters:  @AccountName NVARCHAR(128), required
             @DefaultFromAddress NVARCHAR(320), required: one bare address
                        (the display name goes in @DefaultFromName)
             @DefaultFromName NVARCHAR(200), optional
             @PerMinuteLimit, @PerHourLimit, @PerDayLimit INT > 0, NULL = unlimited
             @IsDefault BIT, default 0: 1 makes this the account EnqueueMail
                        uses when @AccountName is NULL (the previous default is cleared)
Result set:  none.
Errors:      50142 @AccountName missing; 50103 a value over its size;
             50102 @DefaultFromAddress invalid; 50143 a limit not positive.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.UpsertSendingAccount @AccountName = N'qq',
                 @DefaultFromAddress = N'noreply@example.com', @PerMinuteLimit = 20,
                 @PerHourLimit = 500, @PerDayLimit = 5000, @IsDefault = 1;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertSendingAccount
    @AccountName NVARCHAR(4000),
    @DefaultFromAddress NVARCHAR(4000),
    @DefaultFromName NVARCHAR(4000) = NULL,
    @PerMinuteLimit INT = NULL,
    @PerHourLimit INT = NULL,
    @PerDayLimit INT = NULL,
    @IsDefault BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    SET @IsDefault = COALESCE(@IsDefault, 0);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;
    IF LEN(@AccountName) > 128 OR LEN(@DefaultFromAddress) > 320 OR LEN(@DefaultFromName) > 200
        THROW 50103, N'@AccountName (128), @DefaultFromAddress (320) or @DefaultFromName (200) is over its size.', 1;
    IF @DefaultFromName COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(13) + NCHAR(10) + N']%'
        THROW 50105, N'@DefaultFromName contains CR or LF (header injection is refused).', 1;
    IF
        @DefaultFromAddress IS NULL
        OR (SELECT COUNT(*) FROM mailq.ParseAddressList(@DefaultFromAddress)) <> 1
        OR EXISTS (
            SELECT 1
            FROM mailq.ParseAddressList(@DefaultFromAddress) AS a
            WHERE a.Problem IS NOT NULL OR a.DisplayName IS NOT NULL
        )
    BEGIN
        SET @Msg = CONCAT(
            N'@DefaultFromAddress must be one valid address; got ''', LEFT(@DefaultFromAddress, 100), N'''.'
        );
        THROW 50102, @Msg, 1;
    END;
    IF @PerMinuteLimit <= 0 OR @PerHourLimit <= 0 OR @PerDayLimit <= 0
        THROW 50143, N'@PerMinuteLimit, @PerHourLimit and @PerDayLimit must be positive, or NULL for no limit.', 1;

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION UpsertSendingAccount;

        IF @IsDefault = 1
            UPDATE a
            SET a.IsDefault = 0
            FROM mailq.SendingAccount AS a
            WHERE a.IsDefault = 1 AND a.AccountName <> @AccountName;

        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race between two callers.
        IF EXISTS (
            SELECT 1
            FROM mailq.SendingAccount AS a WITH (UPDLOCK, HOLDLOCK)
            WHERE a.AccountName = @AccountName
        )
            UPDATE a
            SET
                a.DefaultFromAddress = LTRIM(RTRIM(@DefaultFromAddress)),
                a.DefaultFromName = @DefaultFromName,
                a.PerMinuteLimit = @PerMinuteLimit,
                a.PerHourLimit = @PerHourLimit,
                a.PerDayLimit = @PerDayLimit,
                a.IsDefault = @IsDefault
            FROM mailq.SendingAccount AS a
            WHERE a.AccountName = @AccountName;
        ELSE
            INSERT INTO mailq.SendingAccount (
                AccountName, DefaultFromAddress, DefaultFromName,
                PerMinuteLimit, PerHourLimit, PerDayLimit, IsDefault
            )
            VALUES (
                @AccountName, LTRIM(RTRIM(@DefaultFromAddress)), @DefaultFromName,
                @PerMinuteLimit, @PerHourLimit, @PerDayLimit, @IsDefault
            );

        IF NOT EXISTS (SELECT 1 FROM mailq.RateBudget AS b WHERE b.AccountName = @AccountName)
            INSERT INTO mailq.RateBudget (AccountName) VALUES (@AccountName);

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION UpsertSendingAccount;
        THROW;
    END CATCH;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.PurgeMail: deletes finished mail (Sent, Failed, Cancelled, Expired)
whose DateProcessed is older than @OlderThanDays days, with its attachments
and attempts.  Works in batches of @BatchSize mails, one short transaction
per batch, and deletes children in statements of at most 1000 rows: SQL
Server escalates to a table lock when one statement takes about 5,000 locks
on one table, so no statement here comes near that and the queue stays
available to the workers while a purge runs.  Rows locked by others are
skipped (READPAST) and picked up by the next purge.
Parameters:  @OlderThanDays INT >= 0, required; @BatchSize INT 1-1000, default 500.
Result set:  one row: PurgedCount BIGINT.
Errors:      50135 @OlderThanDays missing or negative; 50140 @BatchSize out of range.
Transaction: must not be called inside a transaction (50141): each batch
             commits on its own, which is the point.
Example:     EXEC mailq.PurgeMail @OlderThanDays = 30;
*/
CREATE OR ALTER PROCEDURE mailq.PurgeMail
    @OlderThanDays INT,
    @BatchSize INT = 500
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @OlderThanDays IS NULL OR @OlderThanDays < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@OlderThanDays must be 0 or more; got ', COALESCE(CAST(@OlderThanDays AS NVARCHAR(12)), N'NULL'), N'.'
        );
        THROW 50135, @Msg, 1;
    END;
    SET @BatchSize = COALESCE(@BatchSize, 500);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50140, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50141, N'mailq.PurgeMail commits batch by batch: call it outside a transaction.', 1;

    DECLARE @Cutoff DATETIME2(3) = DATEADD(DAY, -@OlderThanDays, SYSUTCDATETIME());
    DECLARE @Purged BIGINT = 0;
    DECLARE @Batch TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Deleted INT;

    WHILE 1 = 1
    BEGIN
        DELETE FROM @Batch;
        BEGIN TRY
            BEGIN TRANSACTION;

            -- IX_MailQueue_Final: a range seek on the oldest finished mail.
            -- UPDLOCK, READPAST, ROWLOCK: lock the batch, skip rows others hold.
            INSERT INTO @Batch (ID)
            SELECT TOP (@BatchSize) q.ID
            FROM mailq.MailQueue AS q WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired')
                AND q.DateProcessed < @Cutoff
            ORDER BY q.DateProcessed ASC, q.ID ASC;

            IF @@ROWCOUNT = 0
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) a
                FROM mailq.MailAttachment AS a
                WHERE a.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;

            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) t
                FROM mailq.MailAttempt AS t
                WHERE t.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;

            DELETE q
            FROM mailq.MailQueue AS q
            WHERE q.ID IN (SELECT b.ID FROM @Batch AS b);
            SET @Purged += @@ROWCOUNT;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;
    END;

    SELECT @Purged AS PurgedCount;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.RequeueMail: puts a Failed, Cancelled or Expired mail back in the
queue (UnSent) with a fresh set of attempts; PossibleDuplicate and the
attempt history are kept.  An expiry time that is not after the new due time
is cleared (the mail would otherwise expire at once).
Parameters:  @ID BIGINT, required; @MaxAttempts INT 1-20, default 5;
             @DateToProcess DATETIME2(3) UTC, default now.
Result set:  one row: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50136 @ID missing; 50119 @MaxAttempts out of range;
             50201 unknown mail; 50205 the mail is not Failed, Cancelled or Expired.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.RequeueMail @ID = 101, @MaxAttempts = 3;
*/
CREATE OR ALTER PROCEDURE mailq.RequeueMail
    @ID BIGINT,
    @MaxAttempts INT = 5,
    @DateToProcess DATETIME2(3) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50136, N'@ID is required.', 1;
    SET @MaxAttempts = COALESCE(@MaxAttempts, 5);
    IF @MaxAttempts NOT BETWEEN 1 AND 20
    BEGIN
        SET @Msg = CONCAT(N'@MaxAttempts must be 1-20; got ', @MaxAttempts, N'.');
        THROW 50119, @Msg, 1;
    END;
    SET @DateToProcess = COALESCE(@DateToProcess, SYSUTCDATETIME());

    DECLARE @Status NVARCHAR(16);
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION RequeueMail;

        -- UPDLOCK: check and change under one lock.
        SELECT @Status = q.Status
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @ID;

        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status NOT IN (N'Failed', N'Cancelled', N'Expired')
        BEGIN
            SET @Msg = CONCAT(
                N'Mail ', @ID, N' is ', @Status, N'; only Failed, Cancelled or Expired mail can be requeued.'
            );
            THROW 50205, @Msg, 1;
        END;

        UPDATE q
        SET
            q.Status = N'UnSent',
            q.DateToProcess = @DateToProcess,
            q.VisibleAtUtc = @DateToProcess,
            q.AttemptsRemaining = @MaxAttempts,
            q.ExpiresAtUtc = IIF(q.ExpiresAtUtc > @DateToProcess, q.ExpiresAtUtc, NULL),
            q.DateProcessed = NULL
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION RequeueMail;
        THROW;
    END CATCH;

    SELECT
        @ID AS ID,
        N'UnSent' AS Status,
        @DateToProcess AS NextAttemptUtc;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.CancelMail: cancels a mail that is waiting to be sent (UnSent).  A mail
being sent (Sending) cannot be cancelled safely: the SMTP server may already
have it; cancel again after it was acknowledged, or let it finish.
Parameters:  @ID BIGINT, required.
Result set:  one row: ID, Status ('Cancelled'), NextAttemptUtc (NULL).
Errors:      50136 @ID missing; 50201 unknown mail; 50204 the mail is not UnSent.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.CancelMail @ID = 101;
*/
CREATE OR ALTER PROCEDURE mailq.CancelMail
    @ID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50136, N'@ID is required.', 1;

    DECLARE @Status NVARCHAR(16);
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION CancelMail;

        -- UPDLOCK: read and change the row under one lock, so a claim cannot
        -- slip in between the check and the update.
        SELECT @Status = q.Status
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @ID;

        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status <> N'UnSent'
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' is ', @Status, N'; only an UnSent mail can be cancelled.');
            THROW 50204, @Msg, 1;
        END;

        UPDATE q
        SET
            q.Status = N'Cancelled',
            q.DateProcessed = SYSUTCDATETIME()
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION CancelMail;
        THROW;
    END CATCH;

    SELECT
        @ID AS ID,
        N'Cancelled' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.MarkFailed: records a failed attempt; fenced by the lock token, all or
nothing.  @Disposition follows TinyMail's error classes:
  Retry  transient (4xx on the mail, dropped connection, timeout): the attempt
         is consumed; the mail is UnSent again after @RetryAfterSeconds, or
         after exponential backoff with jitter: 30 s * 2^(attempt-1), at most
         1 hour, times a random 0.8-1.2; Failed when no attempt is left.
  Wait   the account is throttled or locked (421, rate limits): the attempt is
         refunded, the mail is UnSent again after @RetryAfterSeconds (default
         60), and the account is blocked until then (ClaimMail skips it).
  Stop   permanent (5xx, malformed mail): Failed at once.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required; @Disposition NVARCHAR(8),
             required; @Error NVARCHAR(4000), required: what happened;
             @RetryAfterSeconds INT 0-604800, optional; @SmtpCode INT 200-599, optional.
Result set:  one row per mail: ID, Status (UnSent or Failed), NextAttemptUtc
             (NULL when Failed).
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail);
             50133 @Disposition unknown; 50134 @RetryAfterSeconds out of range;
             50139 @Error missing; 50147 @SmtpCode out of range.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.MarkFailed @ID = 101, @LockToken = @T, @Disposition = N'Retry',
                 @Error = N'451 4.3.0 try again later', @SmtpCode = 451;
*/
CREATE OR ALTER PROCEDURE mailq.MarkFailed
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @Disposition NVARCHAR(20),
    @Error NVARCHAR(4000),
    @RetryAfterSeconds INT = NULL,
    @SmtpCode INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @Disposition IS NULL OR @Disposition NOT IN (N'Retry', N'Wait', N'Stop')
    BEGIN
        SET @Msg = CONCAT(N'@Disposition must be Retry, Wait or Stop; got ''', @Disposition, N'''.');
        THROW 50133, @Msg, 1;
    END;
    IF NULLIF(LTRIM(RTRIM(@Error)), N'') IS NULL
        THROW 50139, N'@Error is required: say what failed (the SMTP reply or the exception).', 1;
    IF @RetryAfterSeconds NOT BETWEEN 0 AND 604800
    BEGIN
        SET @Msg = CONCAT(N'@RetryAfterSeconds must be 0-604800 (7 days); got ', @RetryAfterSeconds, N'.');
        THROW 50134, @Msg, 1;
    END;
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @WaitUntil DATETIME2(3) = DATEADD(SECOND, COALESCE(@RetryAfterSeconds, 60), @Now);
    DECLARE @Acked TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AttemptNo INT NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        Status NVARCHAR(16) NOT NULL,
        NextAttemptUtc DATETIME2(3) NULL
    );

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION MarkFailed;

        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;

        WITH Outcome AS (
            SELECT
                q.ID,
                q.AccountName,
                q.Status,
                q.ThreadLock,
                q.VisibleAtUtc,
                q.AttemptsRemaining,
                q.AttemptCount,
                q.DateProcessed,
                q.LastError,
                CASE
                    WHEN @Disposition = N'Wait' THEN N'UnSent'
                    WHEN @Disposition = N'Retry' AND q.AttemptsRemaining > 0 THEN N'UnSent'
                    ELSE N'Failed'
                END AS NewStatus,
                CASE
                    WHEN @Disposition = N'Wait' THEN @WaitUntil
                    WHEN @RetryAfterSeconds IS NOT NULL THEN DATEADD(SECOND, @RetryAfterSeconds, @Now)
                    -- Exponential backoff with jitter; NEWID() gives each row its own.
                    ELSE DATEADD(
                        MILLISECOND,
                        CAST(
                            IIF(
                                q.AttemptCount >= 8, 3600,
                                30 * POWER(2, IIF(q.AttemptCount < 1, 0, q.AttemptCount - 1))
                            )
                            -- modulo before ABS: ABS(-2147483648) would overflow
                            * (800 + ABS(CHECKSUM(NEWID()) % 401)) AS INT
                        ),
                        @Now
                    )
                END AS RetryAtUtc
            FROM mailq.MailQueue AS q
            INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
            WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken
        )

        UPDATE o
        SET
            o.Status = o.NewStatus,
            o.ThreadLock = NULL,
            o.VisibleAtUtc = IIF(o.NewStatus = N'UnSent', o.RetryAtUtc, o.VisibleAtUtc),
            -- Wait is not the mail's fault: its attempt is refunded.
            o.AttemptsRemaining = o.AttemptsRemaining + IIF(@Disposition = N'Wait', 1, 0),
            o.DateProcessed = @Now,
            o.LastError = @Error
        OUTPUT
            inserted.ID,
            inserted.AttemptCount,
            inserted.AccountName,
            inserted.Status,
            IIF(inserted.Status = N'UnSent', inserted.VisibleAtUtc, NULL)
        INTO @Acked (ID, AttemptNo, AccountName, Status, NextAttemptUtc)
        FROM Outcome AS o;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = @Disposition,
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @Error
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;

        IF @Disposition = N'Wait'
            UPDATE s
            SET
                s.BlockedUntilUtc = IIF(s.BlockedUntilUtc > @WaitUntil, s.BlockedUntilUtc, @WaitUntil),
                s.BlockReason = @Error
            FROM mailq.SendingAccount AS s
            WHERE s.AccountName IN (SELECT a.AccountName FROM @Acked AS a);

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION MarkFailed;
        THROW;
    END CATCH;

    SELECT
        a.ID,
        a.Status,
        a.NextAttemptUtc
    FROM @Acked AS a
    ORDER BY a.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.MarkSent: records mails as sent; fenced by the lock token and all or
nothing, so one call acknowledges every mail sent on one SMTP connection.
Repeatable: a mail this token already marked Sent is accepted again and left
unchanged, so a worker whose connection dropped before the reply can simply
call again.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array of 1-1000 IDs):
             exactly one; @LockToken UNIQUEIDENTIFIER, required;
             @SmtpCode INT 200-599 and @SmtpText NVARCHAR(4000): the server's
             final reply, optional; @DryRun BIT, default 0: 1 records that
             nothing was sent (worker dry-run mode).
Result set:  one row per mail named: ID, Status ('Sent'), NextAttemptUtc (NULL).
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail);
             50147 @SmtpCode out of range.  On any error nothing is written.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.MarkSent @IDList = N'[101,102]', @LockToken = @T, @SmtpCode = 250;
*/
CREATE OR ALTER PROCEDURE mailq.MarkSent
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @SmtpCode INT = NULL,
    @SmtpText NVARCHAR(4000) = NULL,
    @DryRun BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    SET @DryRun = COALESCE(@DryRun, 0);
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Acked TABLE (ID BIGINT NOT NULL PRIMARY KEY, AttemptNo INT NOT NULL);

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION MarkSent;

        EXEC mailq.LockLeasedMail
            @ID = @ID, @IDList = @IDList, @LockToken = @LockToken, @AcceptSentByToken = 1;

        UPDATE q
        SET
            q.Status = N'Sent',
            q.ThreadLock = NULL,
            q.SentAtUtc = @Now,
            q.DateProcessed = @Now,
            q.DryRun = @DryRun,
            q.LastError = NULL
        OUTPUT inserted.ID, inserted.AttemptCount INTO @Acked (ID, AttemptNo)
        FROM mailq.MailQueue AS q
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = IIF(@DryRun = 1, N'DryRun', N'Sent'),
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @SmtpText
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION MarkSent;
        THROW;
    END CATCH;

    SELECT
        l.ID,
        N'Sent' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc
    FROM mailq.ParseIDList(@ID, @IDList) AS l
    ORDER BY l.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.ReleaseMail: gives back mails a worker holds but has not sent (e.g. on
shutdown): UnSent and due now, the attempt refunded, the attempt row closed
as Released.  Fenced by the lock token, all or nothing.  The rate budget the
claim took is not refunded (limits stay conservative).
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required.
Result set:  one row per mail: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail).
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.ReleaseMail @IDList = N'[103,104]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.ReleaseMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Released TABLE (ID BIGINT NOT NULL PRIMARY KEY, AttemptNo INT NOT NULL);

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION ReleaseMail;

        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;

        UPDATE q
        SET
            q.Status = N'UnSent',
            q.ThreadLock = NULL,
            q.VisibleAtUtc = @Now,
            q.AttemptsRemaining = q.AttemptsRemaining + 1
        OUTPUT inserted.ID, inserted.AttemptCount INTO @Released (ID, AttemptNo)
        FROM mailq.MailQueue AS q
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Released'
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Released AS r ON t.MailID = r.ID AND t.AttemptNo = r.AttemptNo;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION ReleaseMail;
        THROW;
    END CATCH;

    SELECT
        r.ID,
        N'UnSent' AS Status,
        @Now AS NextAttemptUtc
    FROM @Released AS r
    ORDER BY r.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.ExtendLease: pushes the lease of mails a worker still holds (long
batches), fenced by the lock token, all or nothing.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required; @LeaseSeconds INT 1-3600,
             default 300: the new lease runs from now.
Result set:  one row per mail: ID, LeaseExpiresUtc.
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail);
             50132 @LeaseSeconds out of range.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.ExtendLease @IDList = N'[101,102]', @LockToken = @T, @LeaseSeconds = 300;
*/
CREATE OR ALTER PROCEDURE mailq.ExtendLease
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT = 300
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    SET @LeaseSeconds = COALESCE(@LeaseSeconds, 300);
    IF @LeaseSeconds NOT BETWEEN 1 AND 3600
    BEGIN
        SET @Msg = CONCAT(N'@LeaseSeconds must be 1-3600; got ', @LeaseSeconds, N'.');
        THROW 50132, @Msg, 1;
    END;

    DECLARE @LeaseUntil DATETIME2(3) = DATEADD(SECOND, @LeaseSeconds, SYSUTCDATETIME());
    DECLARE @Extended TABLE (ID BIGINT NOT NULL PRIMARY KEY, LeaseExpiresUtc DATETIME2(3) NOT NULL);

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION ExtendLease;

        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;

        UPDATE q
        SET q.VisibleAtUtc = @LeaseUntil
        OUTPUT inserted.ID, inserted.VisibleAtUtc INTO @Extended (ID, LeaseExpiresUtc)
        FROM mailq.MailQueue AS q
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION ExtendLease;
        THROW;
    END CATCH;

    SELECT
        e.ID,
        e.LeaseExpiresUtc
    FROM @Extended AS e
    ORDER BY e.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.EnqueueMail: validates one mail and queues it; with an idempotency key
that is already queued it returns the existing mail and inserts nothing.
Parameters:  @ToAddress   NVARCHAR(MAX), required: ';'-separated entries, each
                          an address or 'Display Name <address>'
             @Subject     NVARCHAR(MAX), required (N'' for none), <= 900 chars
             @Body        NVARCHAR(MAX), required, <= 2,000,000 chars
             @BodyFormat  N'Text' (default) or N'Html'
             @TextBody    plain-text alternative of an Html body, <= 2,000,000 chars
             @CC, @BCC    ';'-separated addresses; BCC is never sent as a header
             @FromAddress default: the account's DefaultFromAddress
             @FromName    default: the account's DefaultFromName, <= 200 chars
             @ReplyTo     one address
             @Headers     business headers: a JSON object of string values,
                          e.g. N'{"X-Order-Id": "42"}'; at most 50
             @AccountName default: the default sending account
             @AppName     a registered application (mailq.UpsertApplication)
             @Priority    0-9, 9 first, default 5
             @DateToProcess  UTC time to send at, default now
             @ExpiresAtUtc   UTC time after which the mail is Expired unsent
             @MaxAttempts    1-20, default 5
             @IdempotencyKey <= 200 chars; see "Idempotency" below
             @Attachments    JSON array of {"FileName", "ContentType",
                          "ContentBase64"}; <= 10 files, 10 MiB each, 25 MiB in all
             NULL for an optional parameter means its default.
Outputs:     @MailID BIGINT, @MessageID NVARCHAR(255) (RFC 5322 Message-ID,
             sent unchanged by every attempt), @Created BIT (0 when an existing
             mail was returned for the idempotency key).  No result set, so the
             procedure can be called from triggers.
Idempotency: the key is global.  The same key with the same content (the
             parameters exactly as passed, attachments included) returns the
             first mail; with different content it raises 50116 and writes
             nothing.  A key is free again once PurgeMail deleted its mail.
Errors:      50101 no recipient in @ToAddress; 50102 an invalid address;
             50103 a value over its size; 50104 more than 100 recipients;
             50105 CR or LF in a header value (header injection);
             50106 @Headers not a JSON object of string values;
             50107 invalid header name; 50108 header would override a reserved one;
             50109 @Priority not 0-9; 50110 @ExpiresAtUtc not after the due time;
             50111 body over its limit; 50112 attachment count or size over limit;
             50113 attachment file name empty or path-like;
             50114 unknown (or no default) account; 50115 unknown application;
             50116 idempotency key reused with different content;
             50117 @Attachments malformed; 50118 @BodyFormat not Text or Html;
             50119 @MaxAttempts not 1-20; 50120 @Body missing; 50121 @Subject missing.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     DECLARE @ID BIGINT;
             EXEC mailq.EnqueueMail @ToAddress = N'ops@example.com',
                 @Subject = N'Nightly report', @Body = N'All jobs succeeded.',
                 @MailID = @ID OUTPUT;
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMail
    @ToAddress NVARCHAR(MAX),
    @Subject NVARCHAR(MAX),
    @Body NVARCHAR(MAX),
    @BodyFormat NVARCHAR(20) = N'Text',
    @TextBody NVARCHAR(MAX) = NULL,
    @CC NVARCHAR(MAX) = NULL,
    @BCC NVARCHAR(MAX) = NULL,
    @FromAddress NVARCHAR(MAX) = NULL,
    @FromName NVARCHAR(MAX) = NULL,
    @ReplyTo NVARCHAR(MAX) = NULL,
    @Headers NVARCHAR(MAX) = NULL,
    @AccountName NVARCHAR(4000) = NULL,
    @AppName NVARCHAR(4000) = NULL,
    @Priority INT = 5,
    @DateToProcess DATETIME2(3) = NULL,
    @ExpiresAtUtc DATETIME2(3) = NULL,
    @MaxAttempts INT = 5,
    @IdempotencyKey NVARCHAR(4000) = NULL,
    @Attachments NVARCHAR(MAX) = NULL,
    @MailID BIGINT = NULL OUTPUT,
    @MessageID NVARCHAR(255) = NULL OUTPUT,
    @Created BIT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Msg NVARCHAR(2048);
    -- Tested under a binary collation (COLLATE Latin1_General_100_BIN2): under
    -- a linguistic collation control characters can be ignorable in LIKE.
    DECLARE @CrLf NVARCHAR(10) = N'%[' + NCHAR(13) + NCHAR(10) + N']%';

    -- The content hash covers the parameters exactly as passed (before
    -- defaults), so that the same call is recognised as the same mail.
    DECLARE @ContentJson NVARCHAR(MAX) = (
        SELECT
            @ToAddress AS ToAddress, @CC AS CC, @BCC AS BCC, @Subject AS Subject,
            @Body AS Body, @BodyFormat AS BodyFormat, @TextBody AS TextBody,
            @FromAddress AS FromAddress, @FromName AS FromName, @ReplyTo AS ReplyTo,
            @Headers AS Headers, @AccountName AS AccountName, @AppName AS AppName,
            @Priority AS Priority, @DateToProcess AS DateToProcess,
            @ExpiresAtUtc AS ExpiresAtUtc, @MaxAttempts AS MaxAttempts,
            @Attachments AS Attachments
        FOR JSON PATH, WITHOUT_ARRAY_WRAPPER, INCLUDE_NULL_VALUES
    );

    SET @BodyFormat = COALESCE(@BodyFormat, N'Text');
    SET @Priority = COALESCE(@Priority, 5);
    SET @MaxAttempts = COALESCE(@MaxAttempts, 5);
    SET @DateToProcess = COALESCE(@DateToProcess, @Now);

    -- 1. Validate parameters before any transaction starts.
    IF @ToAddress IS NULL OR NOT EXISTS (SELECT 1 FROM mailq.ParseAddressList(@ToAddress))
        THROW 50101, N'@ToAddress is required: give at least one recipient address (separate several with ;).', 1;
    IF @Subject IS NULL
        THROW 50121, N'@Subject is required (pass N'''' for a mail without subject).', 1;
    IF @Body IS NULL
        THROW 50120, N'@Body is required.', 1;

    SELECT TOP (1)
        @Msg = CONCAT(v.ParamName, N' is ', LEN(v.Value), N' characters long; the limit is ', v.MaxLength, N'.')
    FROM (
        VALUES
        (1, N'@ToAddress', @ToAddress, 4000), (2, N'@CC', @CC, 4000), (3, N'@BCC', @BCC, 4000),
        (4, N'@Subject', @Subject, 900), (5, N'@FromAddress', @FromAddress, 320),
        (6, N'@FromName', @FromName, 200), (7, N'@ReplyTo', @ReplyTo, 320),
        (8, N'@AccountName', @AccountName, 128), (9, N'@AppName', @AppName, 128),
        (10, N'@IdempotencyKey', @IdempotencyKey, 200)
    ) AS v(Position, ParamName, Value, MaxLength)
    WHERE LEN(v.Value) > v.MaxLength
    ORDER BY v.Position;
    IF @Msg IS NOT NULL THROW 50103, @Msg, 1;

    SELECT TOP (1)
        @Msg = CONCAT(v.ParamName, N' contains CR or LF; header values must be one line (header injection is refused).')
    FROM (
        VALUES
        (1, N'@Subject', @Subject), (2, N'@FromName', @FromName), (3, N'@ReplyTo', @ReplyTo),
        (4, N'@FromAddress', @FromAddress), (5, N'@IdempotencyKey', @IdempotencyKey)
    ) AS v(Position, ParamName, Value)
    WHERE v.Value COLLATE Latin1_General_100_BIN2 LIKE @CrLf
    ORDER BY v.Position;
    IF @Msg IS NOT NULL THROW 50105, @Msg, 1;

    SELECT TOP (1)
        @Msg = CONCAT(
            v.ParamName, N': address ''', LEFT(a.Address, 100), N''' ', a.Problem, N'.'
        )
    FROM (
        VALUES
        (1, N'@ToAddress', @ToAddress), (2, N'@CC', @CC), (3, N'@BCC', @BCC),
        (4, N'@ReplyTo', @ReplyTo), (5, N'@FromAddress', @FromAddress)
    ) AS v(Position, ParamName, Value)
    CROSS APPLY mailq.ParseAddressList(v.Value) AS a
    WHERE a.Problem IS NOT NULL
    ORDER BY v.Position;
    IF @Msg IS NOT NULL THROW 50102, @Msg, 1;

    IF (SELECT COUNT(*) FROM mailq.ParseAddressList(@ReplyTo)) > 1
        THROW 50102, N'@ReplyTo takes one address.', 1;
    IF (SELECT COUNT(*) FROM mailq.ParseAddressList(@FromAddress)) > 1
        THROW 50102, N'@FromAddress takes one address.', 1;
    IF EXISTS (SELECT 1 FROM mailq.ParseAddressList(@FromAddress) AS a WHERE a.DisplayName IS NOT NULL)
        THROW 50102, N'@FromAddress takes a bare address; give the display name in @FromName.', 1;

    DECLARE @RecipientCount INT = (
        SELECT COUNT(*)
        FROM (VALUES (@ToAddress), (@CC), (@BCC)) AS v(Value)
        CROSS APPLY mailq.ParseAddressList(v.Value)
    );
    IF @RecipientCount > 100
    BEGIN
        SET @Msg = CONCAT(N'@ToAddress, @CC and @BCC name ', @RecipientCount, N' recipients; the limit is 100.');
        THROW 50104, @Msg, 1;
    END;

    IF @BodyFormat NOT IN (N'Text', N'Html')
    BEGIN
        SET @Msg = CONCAT(N'@BodyFormat must be Text or Html; got ''', LEFT(@BodyFormat, 20), N'''.');
        THROW 50118, @Msg, 1;
    END;
    IF @Priority NOT BETWEEN 0 AND 9
    BEGIN
        SET @Msg = CONCAT(N'@Priority must be 0-9 (9 is sent first); got ', @Priority, N'.');
        THROW 50109, @Msg, 1;
    END;
    IF @MaxAttempts NOT BETWEEN 1 AND 20
    BEGIN
        SET @Msg = CONCAT(N'@MaxAttempts must be 1-20; got ', @MaxAttempts, N'.');
        THROW 50119, @Msg, 1;
    END;
    IF @ExpiresAtUtc <= @DateToProcess
    BEGIN
        SET @Msg = CONCAT(
            N'@ExpiresAtUtc (', CONVERT(NVARCHAR(30), @ExpiresAtUtc, 126),
            N') must be later than the due time (', CONVERT(NVARCHAR(30), @DateToProcess, 126), N').'
        );
        THROW 50110, @Msg, 1;
    END;
    IF LEN(@Body) > 2000000 OR LEN(@TextBody) > 2000000
        THROW 50111, N'@Body and @TextBody are limited to 2,000,000 characters each.', 1;

    -- Business headers: a JSON object whose values are strings.
    IF @Headers IS NOT NULL
    BEGIN
        IF ISJSON(@Headers) = 0 OR LEFT(LTRIM(@Headers), 1) <> N'{'
            THROW 50106, N'@Headers must be a JSON object of string values, e.g. {"X-Order-Id": "42"}.', 1;

        SELECT TOP (1) @Msg = CONCAT(N'@Headers: the value of ''', LEFT(j.[key], 80), N''' must be a JSON string.')
        FROM OPENJSON(@Headers) AS j
        WHERE j.[type] <> 1;
        IF @Msg IS NOT NULL THROW 50106, @Msg, 1;

        IF (SELECT COUNT(*) FROM OPENJSON(@Headers)) > 50
            THROW 50106, N'@Headers holds more than 50 headers.', 1;

        IF EXISTS (
            SELECT UPPER(j.[key]) AS HeaderName
            FROM OPENJSON(@Headers) AS j
            GROUP BY UPPER(j.[key])
            HAVING COUNT(*) > 1
        )
            THROW 50106, N'@Headers names one header twice.', 1;

        -- RFC 5322 field name: 1-76 printable US-ASCII characters except ':'
        -- (the binary collation makes the ranges code-point ranges).
        SELECT TOP (1) @Msg = CONCAT(
            N'@Headers: ''', LEFT(j.[key], 80), N''' is not a valid header name ',
            N'(1-76 printable ASCII characters, no space or colon).'
        )
        FROM OPENJSON(@Headers) AS j
        WHERE
            LEN(j.[key]) NOT BETWEEN 1 AND 76
            OR j.[key] COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-9;-~]%';
        IF @Msg IS NOT NULL THROW 50107, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(N'@Headers: ''', j.[key], N''' is set by mailq-db and cannot be overridden.')
        FROM OPENJSON(@Headers) AS j
        WHERE UPPER(j.[key]) IN (
            N'FROM', N'TO', N'CC', N'BCC', N'SUBJECT', N'MESSAGE-ID', N'DATE', N'REPLY-TO',
            N'SENDER', N'RETURN-PATH', N'MIME-VERSION', N'CONTENT-TYPE',
            N'CONTENT-TRANSFER-ENCODING', N'CONTENT-DISPOSITION'
        );
        IF @Msg IS NOT NULL THROW 50108, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(
            N'@Headers: the value of ''', j.[key], N''' contains CR or LF (header injection is refused).'
        )
        FROM OPENJSON(@Headers) AS j
        WHERE j.[value] COLLATE Latin1_General_100_BIN2 LIKE @CrLf;
        IF @Msg IS NOT NULL THROW 50105, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(N'@Headers: the value of ''', j.[key], N''' is longer than 900 characters.')
        FROM OPENJSON(@Headers) AS j
        WHERE LEN(j.[value]) > 900;
        IF @Msg IS NOT NULL THROW 50103, @Msg, 1;
    END;

    -- Account and application.
    DECLARE @ResolvedAccount NVARCHAR(128), @DefaultFrom NVARCHAR(320), @DefaultFromName NVARCHAR(200);
    SELECT
        @ResolvedAccount = a.AccountName,
        @DefaultFrom = a.DefaultFromAddress,
        @DefaultFromName = a.DefaultFromName
    FROM mailq.SendingAccount AS a
    WHERE
        (@AccountName IS NOT NULL AND a.AccountName = @AccountName)
        OR (@AccountName IS NULL AND a.IsDefault = 1);
    IF @ResolvedAccount IS NULL
    BEGIN
        SET @Msg = IIF(
            @AccountName IS NULL,
            N'@AccountName is NULL and no default sending account exists (mailq.UpsertSendingAccount @IsDefault = 1).',
            CONCAT(N'@AccountName ''', @AccountName, N''' is not a sending account (mailq.UpsertSendingAccount).')
        );
        THROW 50114, @Msg, 1;
    END;
    IF @AppName IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(N'@AppName ''', @AppName, N''' is not a registered application (mailq.UpsertApplication).');
        THROW 50115, @Msg, 1;
    END;

    SET @FromAddress = LTRIM(RTRIM(COALESCE(@FromAddress, @DefaultFrom)));
    SET @FromName = COALESCE(@FromName, @DefaultFromName);

    -- Attachments: decoded from base64 by OPENJSON ... WITH (VARBINARY), which
    -- raises an error for text that is not base64: caught and reported as 50117.
    DECLARE @Attachment TABLE (
        AttachmentNo INT NOT NULL PRIMARY KEY,
        FileName NVARCHAR(4000) NULL,
        ContentType NVARCHAR(4000) NULL,
        Content VARBINARY(MAX) NULL
    );
    IF @Attachments IS NOT NULL
    BEGIN
        IF ISJSON(@Attachments) = 0 OR LEFT(LTRIM(@Attachments), 1) <> N'['
            THROW 50117,
                N'@Attachments must be a JSON array of {"FileName", "ContentType", "ContentBase64"} objects.',
                1;
        IF EXISTS (SELECT 1 FROM OPENJSON(@Attachments) AS e WHERE e.[type] <> 5)
            THROW 50117, N'@Attachments: every element must be an object with FileName and ContentBase64.', 1;
        BEGIN TRY
            INSERT INTO @Attachment (AttachmentNo, FileName, ContentType, Content)
            SELECT
                CAST(e.[key] AS INT) + 1 AS AttachmentNo,
                f.FileName,
                f.ContentType,
                f.Content
            FROM OPENJSON(@Attachments) AS e
            CROSS APPLY OPENJSON (e.[value])
                WITH (
                    FileName NVARCHAR(4000) '$.FileName',
                    ContentType NVARCHAR(4000) '$.ContentType',
                    Content VARBINARY(MAX) '$.ContentBase64'
                ) AS f;
        END TRY
        BEGIN CATCH
            SET @Msg = CONCAT(N'@Attachments: ContentBase64 must be base64 text (', ERROR_MESSAGE(), N').');
            THROW 50117, @Msg, 1;
        END CATCH;

        IF EXISTS (SELECT 1 FROM @Attachment AS t WHERE t.Content IS NULL)
            THROW 50117, N'@Attachments: every element must be an object with FileName and ContentBase64.', 1;
        IF (SELECT COUNT(*) FROM @Attachment) > 10
            THROW 50112, N'@Attachments holds more than 10 attachments.', 1;

        SELECT TOP (1) @Msg = CONCAT(
            N'@Attachments: file name ''', LEFT(t.FileName, 100),
            N''' must be a bare file name (not empty, no path, no control characters, <= 255 characters).'
        )
        FROM @Attachment AS t
        WHERE
            NULLIF(LTRIM(RTRIM(t.FileName)), N'') IS NULL
            OR t.FileName LIKE N'%[/\:]%'
            OR t.FileName IN (N'.', N'..')
            OR t.FileName COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%'
            OR LEN(t.FileName) > 255
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50113, @Msg, 1;

        SELECT TOP (1)
            @Msg = CONCAT(N'@Attachments: content type of ''', t.FileName, N''' must look like type/subtype.')
        FROM @Attachment AS t
        WHERE
            t.ContentType IS NOT NULL
            AND (
                t.ContentType NOT LIKE N'_%/_%'
                OR t.ContentType COLLATE Latin1_General_100_BIN2 LIKE @CrLf
                OR LEN(t.ContentType) > 255
            )
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50117, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(
            N'@Attachments: ''', t.FileName, N''' is ', DATALENGTH(t.Content),
            N' bytes; the limit is 10485760 (10 MiB) per attachment.'
        )
        FROM @Attachment AS t
        WHERE DATALENGTH(t.Content) > 10485760
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50112, @Msg, 1;

        IF (SELECT SUM(CAST(DATALENGTH(t.Content) AS BIGINT)) FROM @Attachment AS t) > 26214400
            THROW 50112, N'@Attachments total more than 26214400 bytes (25 MiB) per mail.', 1;
    END;

    DECLARE @ContentHash VARBINARY(32) = HASHBYTES('SHA2_256', @ContentJson);
    DECLARE @Domain NVARCHAR(320) = SUBSTRING(@FromAddress, CHARINDEX(N'@', @FromAddress) + 1, 320);
    -- A Message-ID must be ASCII: a non-ASCII sender domain gets a neutral one.
    IF @Domain COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-~]%' SET @Domain = N'mailq-db.invalid';

    -- 2. Own the transaction, or nest in the caller's with a savepoint.
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION EnqueueMail;

        DECLARE @ExistingHash VARBINARY(32);
        SET @MailID = NULL;
        IF @IdempotencyKey IS NOT NULL
        BEGIN
            -- UPDLOCK, HOLDLOCK: the key-range lock on UX_MailQueue_IdempotencyKey
            -- stops two sessions from both seeing the key absent and inserting.
            SELECT
                @MailID = q.ID,
                @MessageID = q.MessageID,
                @ExistingHash = q.ContentHash
            -- "IS NOT NULL" repeats the index filter, so the filtered index
            -- matches for certain and the range lock stays on one key.
            FROM mailq.MailQueue AS q WITH (UPDLOCK, HOLDLOCK)
            WHERE q.IdempotencyKey = @IdempotencyKey AND q.IdempotencyKey IS NOT NULL;

            IF @MailID IS NOT NULL AND @ExistingHash <> @ContentHash
            BEGIN
                SET @Msg = CONCAT(
                    N'@IdempotencyKey ''', @IdempotencyKey, N''' already belongs to mail ', @MailID,
                    N' with different content; use a new key for a different mail.'
                );
                THROW 50116, @Msg, 1;
            END;
        END;

        IF @MailID IS NOT NULL
            SET @Created = 0;
        ELSE
        BEGIN
            SET @MessageID = CONCAT(N'<', LOWER(CONVERT(NCHAR(36), NEWID())), N'@', @Domain, N'>');

            INSERT INTO mailq.MailQueue (
                dtStamp, DateToProcess, VisibleAtUtc, FromName, FromAddress, ReplyTo,
                ToAddress, CC, BCC, Subject, Body, BodyFormat, TextBody, Headers,
                Status, AttemptsRemaining, Priority, AccountName, AppName,
                IdempotencyKey, ContentHash, MessageID, ExpiresAtUtc
            )
            VALUES (
                @Now, @DateToProcess, @DateToProcess, @FromName, @FromAddress, LTRIM(RTRIM(@ReplyTo)),
                @ToAddress, @CC, @BCC, @Subject, @Body, @BodyFormat, @TextBody, @Headers,
                N'UnSent', @MaxAttempts, @Priority, @ResolvedAccount, @AppName,
                @IdempotencyKey, @ContentHash, @MessageID, @ExpiresAtUtc
            );
            SET @MailID = SCOPE_IDENTITY();

            INSERT INTO mailq.MailAttachment (MailID, AttachmentNo, FileName, ContentType, Content)
            SELECT
                @MailID,
                t.AttachmentNo,
                LTRIM(RTRIM(t.FileName)),
                COALESCE(t.ContentType, N'application/octet-stream'),
                t.Content
            FROM @Attachment AS t;

            SET @Created = 1;
        END;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION EnqueueMail;
        THROW;
    END CATCH;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.LockLeasedMail: the fence of every acknowledgement (internal: called by
ExtendLease, ReleaseMail, MarkSent and MarkFailed inside their transaction;
granted to no role).  Validates @ID / @IDList, then locks the named mails
WITH (UPDLOCK, ROWLOCK) until the caller's transaction ends and raises an
error unless every one of them exists, is Sending and holds @LockToken.  The
caller's UPDATE then cannot race a reclaim: a worker whose lease expired and
was reclaimed is told so and changes nothing (all or nothing).
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (a JSON array of 1-1000
             integers): exactly one; @LockToken UNIQUEIDENTIFIER, required;
             @AcceptSentByToken BIT, default 0: 1 also accepts a mail already
             Sent by an attempt under @LockToken (MarkSent repeated after its
             connection dropped before the reply: the first call committed)
Result set:  none.
Errors:      50131 @LockToken missing; 50136 neither or both of @ID/@IDList;
             50137 @IDList malformed; 50201 unknown mail ID;
             50202 the mail is leased under another token (lease lost);
             50203 the mail is not Sending (already acknowledged or never claimed).
Transaction: must run inside the caller's transaction (raises 50138 otherwise).
Example:     EXEC mailq.LockLeasedMail @IDList = N'[1,2]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.LockLeasedMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @AcceptSentByToken BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @@TRANCOUNT = 0
        THROW 50138, N'mailq.LockLeasedMail must run inside the caller''s transaction.', 1;
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: the token the mails were claimed with.', 1;
    IF (@ID IS NULL AND @IDList IS NULL) OR (@ID IS NOT NULL AND @IDList IS NOT NULL)
        THROW 50136, N'Give exactly one of @ID (one mail) or @IDList (a JSON array of mail IDs).', 1;
    IF
        @IDList IS NOT NULL
        AND (
            ISJSON(@IDList) = 0
            OR LEFT(LTRIM(@IDList), 1) <> N'['
            OR EXISTS (
                SELECT 1
                FROM OPENJSON(@IDList) AS j
                WHERE j.[type] <> 2 OR TRY_CAST(j.[value] AS BIGINT) IS NULL
            )
            OR (SELECT COUNT(*) FROM OPENJSON(@IDList)) NOT BETWEEN 1 AND 1000
        )
        THROW 50137, N'@IDList must be a JSON array of 1-1000 integer mail IDs, e.g. [101, 102].', 1;

    DECLARE @Held TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        Status NVARCHAR(16) NULL,
        ThreadLock UNIQUEIDENTIFIER NULL
    );

    -- UPDLOCK, ROWLOCK: hold the rows until the caller commits, so the fence
    -- checked here still holds when the caller updates them.  No READPAST:
    -- these rows must be seen, and only a reclaiming worker could hold them.
    INSERT INTO @Held (ID, Status, ThreadLock)
    SELECT l.ID, q.Status, q.ThreadLock
    FROM mailq.ParseIDList(@ID, @IDList) AS l
    LEFT JOIN mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK) ON l.ID = q.ID;

    SELECT TOP (1) @Msg = CONCAT(N'Mail ', h.ID, N' does not exist.')
    FROM @Held AS h
    WHERE h.Status IS NULL
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50201, @Msg, 1;

    SELECT TOP (1) @Msg = CONCAT(
        N'Mail ', h.ID, N' is ', h.Status, N', not Sending: it was already acknowledged, released or never claimed.'
    )
    FROM @Held AS h
    WHERE
        h.Status <> N'Sending'
        AND NOT (
            @AcceptSentByToken = 1
            AND h.Status = N'Sent'
            AND EXISTS (
                SELECT 1
                FROM mailq.MailAttempt AS t
                WHERE t.MailID = h.ID AND t.LockToken = @LockToken AND t.Outcome IN (N'Sent', N'DryRun')
            )
        )
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50203, @Msg, 1;

    SELECT TOP (1) @Msg = CONCAT(
        N'Mail ', h.ID, N' is leased under another @LockToken: this worker''s lease expired and the mail ',
        N'was reclaimed; nothing was changed.'
    )
    FROM @Held AS h
    WHERE h.ThreadLock <> @LockToken
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50202, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.RecentFailures: failed attempts of the last 7 days (Retry, Wait, Stop,
Abandoned), with the mail's current status: what went wrong and whether the
mail got through later.  Served by IX_MailAttempt_EndedAtUtc.
*/
CREATE OR ALTER VIEW mailq.RecentFailures
AS
SELECT
    t.MailID AS ID,
    t.AttemptNo,
    q.AccountName,
    q.Status,
    t.Outcome,
    t.SmtpCode,
    t.ErrorText AS LastError,
    t.EndedAtUtc AS DateProcessed
FROM mailq.MailAttempt AS t
INNER JOIN mailq.MailQueue AS q ON t.MailID = q.ID
WHERE
    t.EndedAtUtc >= DATEADD(DAY, -7, SYSUTCDATETIME())
    AND t.Outcome IN (N'Retry', N'Wait', N'Stop', N'Abandoned');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.ThroughputPerHour: attempts finished per UTC hour and account over the
last 48 hours: Sent (Sent and DryRun outcomes) and Failed (Retry, Wait, Stop,
Abandoned outcomes).  Served by IX_MailAttempt_EndedAtUtc.
*/
CREATE OR ALTER VIEW mailq.ThroughputPerHour
AS
WITH RecentAttempt AS (
    SELECT
        t.MailID,
        t.Outcome,
        DATEADD(HOUR, DATEDIFF(HOUR, '20000101', t.EndedAtUtc), CAST('20000101' AS DATETIME2(0))) AS HourUtc
    FROM mailq.MailAttempt AS t
    WHERE t.EndedAtUtc >= DATEADD(HOUR, -48, SYSUTCDATETIME())
)

SELECT
    r.HourUtc,
    q.AccountName,
    SUM(IIF(r.Outcome IN (N'Sent', N'DryRun'), 1, 0)) AS Sent,
    SUM(IIF(r.Outcome IN (N'Retry', N'Wait', N'Stop', N'Abandoned'), 1, 0)) AS Failed
FROM RecentAttempt AS r
INNER JOIN mailq.MailQueue AS q ON r.MailID = q.ID
GROUP BY r.HourUtc, q.AccountName;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.OldestDueMail: per account, the oldest mail that is due and waiting
(UnSent, VisibleAtUtc passed), its age in seconds and how many are due.  A
growing age means the workers fall behind or the account is blocked.
Served by IX_MailQueue_Claim (its filter contains Status = N'UnSent').
*/
CREATE OR ALTER VIEW mailq.OldestDueMail
AS
SELECT
    q.AccountName,
    MIN(q.VisibleAtUtc) AS OldestDueUtc,
    DATEDIFF_BIG(SECOND, MIN(q.VisibleAtUtc), SYSUTCDATETIME()) AS OldestDueAgeSeconds,
    COUNT_BIG(*) AS DueCount
FROM mailq.MailQueue AS q
WHERE q.Status = N'UnSent' AND q.VisibleAtUtc <= SYSUTCDATETIME()
GROUP BY q.AccountName;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.QueueCountsByStatus: how many mails each account has in each status.
Counts the whole table: meant for dashboards and `mailq-db stats`, not for a
tight loop (finished mail is purged by mailq.PurgeMail).
*/
CREATE OR ALTER VIEW mailq.QueueCountsByStatus
AS
SELECT
    q.Status,
    q.AccountName,
    COUNT_BIG(*) AS MailCount
FROM mailq.MailQueue AS q
GROUP BY q.Status, q.AccountName;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (
    SELECT 1
    FROM sys.columns AS c
    WHERE
        c.object_id = OBJECT_ID(N'mailq.MailQueue')
        AND c.name = N'IdempotencyKey'
        AND c.collation_name = N'Latin1_General_100_BIN2'
)
BEGIN
    IF EXISTS (
        SELECT 1
        FROM mailq.MailQueue AS q
        WHERE q.IdempotencyKey IS NOT NULL
        GROUP BY q.IdempotencyKey COLLATE DATABASE_DEFAULT
        HAVING COUNT_BIG(*) > 1
    )
        THROW 50167, N'Downgrade below 0007 refused: mailq.MailQueue holds idempotency keys that differ only under the database collation (case or accent); purge or cancel one of each pair first.', 1;

    DROP INDEX IF EXISTS UX_MailQueue_IdempotencyKey ON mailq.MailQueue;

    DECLARE @DropStats NVARCHAR(MAX) = N'';
    SELECT @DropStats += N'DROP STATISTICS mailq.MailQueue.' + QUOTENAME(s.name) + N'; '
    FROM sys.stats AS s
    INNER JOIN sys.stats_columns AS sc ON s.object_id = sc.object_id AND s.stats_id = sc.stats_id
    INNER JOIN sys.columns AS c ON sc.object_id = c.object_id AND sc.column_id = c.column_id
    WHERE
        s.object_id = OBJECT_ID(N'mailq.MailQueue')
        AND c.name = N'IdempotencyKey'
        AND NOT EXISTS (
            SELECT 1 FROM sys.indexes AS i WHERE i.object_id = s.object_id AND i.index_id = s.stats_id
        );
    EXEC sys.sp_executesql @DropStats;

    -- No COLLATE clause: the column takes the database's default collation again.
    ALTER TABLE mailq.MailQueue ALTER COLUMN IdempotencyKey NVARCHAR(200) NULL;

    EXEC sys.sp_executesql
        N'CREATE UNIQUE NONCLUSTERED INDEX UX_MailQueue_IdempotencyKey
          ON mailq.MailQueue (IdempotencyKey)
          WHERE IdempotencyKey IS NOT NULL;';
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (
    SELECT 1
    FROM sys.tables AS t
    WHERE t.object_id = OBJECT_ID(N'mailq.MailQueue') AND t.large_value_types_out_of_row = 1
)
    EXEC sys.sp_tableoption N'mailq.MailQueue', 'large value types out of row', 0;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_Status ON mailq.MailQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
UX_MailQueue_IdempotencyKey: one mail per idempotency key.  mailq.EnqueueMail
looks the key up WITH (UPDLOCK, HOLDLOCK) before inserting: the range lock on
this index stops two sessions from both seeing the key absent.  Filtered, so
mails without a key (the common case) cost nothing.  A key becomes free again
once mailq.PurgeMail deletes its mail.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'UX_MailQueue_IdempotencyKey' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE UNIQUE NONCLUSTERED INDEX UX_MailQueue_IdempotencyKey
    ON mailq.MailQueue (IdempotencyKey)
    WHERE IdempotencyKey IS NOT NULL;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.ApplicationPrincipal;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.ApplicationFrom;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.ApplicationAccount;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.MailQueue: one row per mail.  The article's column names are kept
(ID, dtStamp, DateToProcess, DateProcessed, FromName, FromAddress, ToAddress,
CC, BCC, Status, ThreadLock, AttemptsRemaining, Priority, Body) and corrected:
BIGINT ID, NVARCHAR text, UTC DATETIME2(3) times, errors in LastError (never in
Status).

Status: UnSent (queued) -> Sending (leased) -> Sent | Failed | Cancelled | Expired.

VisibleAtUtc is the one column the claim ranges over: it holds the due time
while the mail is UnSent and the lease expiry while it is Sending, so "due or
lease expired" is a single range on IX_MailQueue_Claim (an OR across two
columns cannot seek).  DateToProcess keeps the caller's requested due time.

ThreadLock    the lock token of the worker holding the lease (NULL otherwise);
              every acknowledgement is fenced by it.
AttemptCount  attempts started (claims that led to Sending); AttemptsRemaining
              is decremented at claim, so a mail that kills its worker cannot
              loop forever.  Wait and Release refund the attempt.
PossibleDuplicate  set when an expired lease is reclaimed: the first worker may
              have handed the mail to SMTP before dying.
ContentHash   SHA-256 of the enqueued content; an idempotency key reused with
              different content is refused (error 50116).
MessageID     RFC 5322 Message-ID made at enqueue, sent unchanged by every
              attempt so that receivers can drop duplicates.
*/
IF OBJECT_ID(N'mailq.MailQueue', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailQueue (
        ID BIGINT IDENTITY (1, 1) NOT NULL,
        dtStamp DATETIME2(3) NOT NULL CONSTRAINT DF_MailQueue_dtStamp DEFAULT (SYSUTCDATETIME()),
        DateToProcess DATETIME2(3) NOT NULL,
        DateProcessed DATETIME2(3) NULL,
        VisibleAtUtc DATETIME2(3) NOT NULL,
        FromName NVARCHAR(200) NULL,
        FromAddress NVARCHAR(320) NOT NULL,
        ReplyTo NVARCHAR(320) NULL,
        ToAddress NVARCHAR(4000) NOT NULL,
        CC NVARCHAR(4000) NULL,
        BCC NVARCHAR(4000) NULL,
        Subject NVARCHAR(900) NOT NULL,
        Body NVARCHAR(MAX) NOT NULL,
        BodyFormat NVARCHAR(8) NOT NULL CONSTRAINT DF_MailQueue_BodyFormat DEFAULT (N'Text'),
        TextBody NVARCHAR(MAX) NULL,
        Headers NVARCHAR(MAX) NULL,
        Status NVARCHAR(16) NOT NULL CONSTRAINT DF_MailQueue_Status DEFAULT (N'UnSent'),
        ThreadLock UNIQUEIDENTIFIER NULL,
        AttemptsRemaining INT NOT NULL,
        AttemptCount INT NOT NULL CONSTRAINT DF_MailQueue_AttemptCount DEFAULT (0),
        Priority TINYINT NOT NULL CONSTRAINT DF_MailQueue_Priority DEFAULT (5),
        AccountName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NULL,
        IdempotencyKey NVARCHAR(200) NULL,
        ContentHash VARBINARY(32) NOT NULL,
        MessageID NVARCHAR(255) NOT NULL,
        ExpiresAtUtc DATETIME2(3) NULL,
        SentAtUtc DATETIME2(3) NULL,
        LastError NVARCHAR(4000) NULL,
        PossibleDuplicate BIT NOT NULL CONSTRAINT DF_MailQueue_PossibleDuplicate DEFAULT (0),
        DryRun BIT NOT NULL CONSTRAINT DF_MailQueue_DryRun DEFAULT (0),
        CONSTRAINT PK_MailQueue PRIMARY KEY CLUSTERED (ID),
        CONSTRAINT FK_MailQueue_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName),
        CONSTRAINT FK_MailQueue_Application FOREIGN KEY (AppName)
        REFERENCES mailq.Application (AppName),
        CONSTRAINT CK_MailQueue_Status CHECK (
            Status IN (N'UnSent', N'Sending', N'Sent', N'Failed', N'Cancelled', N'Expired')
        ),
        CONSTRAINT CK_MailQueue_Lease CHECK (
            (Status = N'Sending' AND ThreadLock IS NOT NULL)
            OR (Status <> N'Sending' AND ThreadLock IS NULL)
        ),
        CONSTRAINT CK_MailQueue_Priority CHECK (Priority BETWEEN 0 AND 9),
        CONSTRAINT CK_MailQueue_BodyFormat CHECK (BodyFormat IN (N'Text', N'Html')),
        CONSTRAINT CK_MailQueue_Attempts CHECK (AttemptsRemaining >= 0 AND AttemptCount >= 0),
        CONSTRAINT CK_MailQueue_Headers CHECK (Headers IS NULL OR ISJSON(Headers) = 1),
        CONSTRAINT CK_MailQueue_Expiry CHECK (ExpiresAtUtc IS NULL OR ExpiresAtUtc > DateToProcess)
    );
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0007';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0007 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0006' WHERE dbo.mailq_alembic_version.version_num = '0007';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0006 -> 0005

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0006')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0006; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Activation INT = (
    SELECT CAST(q.is_activation_enabled AS INT) FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ'));
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = @Activation;
IF @Activation = 1
    ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.PendingTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.PendingTasks FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.RunningTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.RunningTasks FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.FailedTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.FailedTasks FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.RefusedTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.RefusedTasks FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Health') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.Health FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'dbo.CancelDelayExecution') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::dbo.CancelDelayExecution FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Reconcile') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::delay.Reconcile FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
Grants of role MailqAdmin (created in sql/security/MailqAdmin.role.sql) on
delayed execution: reading the operator views, and cancelling tasks.
Not the allow-list procedures (delay.AllowProcedure, delay.DisallowProcedure):
a listed procedure runs as dbo, so listing stays with db_owner.
delay.Health also needs VIEW SERVER STATE for its ActiveReaders column, a
server permission that a database role cannot carry.
*/
GRANT SELECT ON OBJECT::delay.PendingTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.RunningTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.FailedTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.RefusedTasks TO MailqAdmin;
GRANT SELECT ON OBJECT::delay.Health TO MailqAdmin;
GRANT EXECUTE ON OBJECT::dbo.CancelDelayExecution TO MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS delay.Reconcile;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
delay.AllowProcedure: puts a procedure on the allow-list of delayed execution,
or refreshes its entry (after the procedure was dropped and recreated).
Parameters:  @ProcedureName NVARCHAR(4000), required: schema-qualified,
                 N'dbo.TCXG' or N'[dbo].[TCXG]'; an existing SQL procedure of
                 this database that takes the target contract's parameters
                 @SPName, @Param1, @Param2, @Param3, @Param4, @Param5
             @AllowBareName BIT = 0: 1 lets the bare name (N'TCXG', as the
                 platform stores it) resolve to this procedure; at most one
                 listed procedure per bare name
Result set:  one row: AllowedProcedureId INT, SchemaName SYSNAME,
             ProcedureName SYSNAME, ObjectId INT, AllowBareName BIT
Errors:      50310 @ProcedureName is not a two-part name of an existing SQL
                   procedure of this database
             50311 @ProcedureName is a system procedure (sys or
                   INFORMATION_SCHEMA schema, or shipped with SQL Server)
             50312 the procedure lacks a parameter of the target contract
             50313 @AllowBareName = 1, but another listed procedure already
                   answers to that bare name
Transaction: joins the caller's via a savepoint, else opens its own.
Security:    for db_owner only (no role is granted EXECUTE): a listed procedure
             runs as dbo, so listing one is a dbo-level decision.
Example:     EXEC delay.AllowProcedure @ProcedureName = N'dbo.TCXG', @AllowBareName = 1;
*/
CREATE OR ALTER PROCEDURE delay.AllowProcedure
    @ProcedureName NVARCHAR(4000),
    @AllowBareName BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE
        @Msg NVARCHAR(2048),
        @Part1 SYSNAME,
        @Part2 SYSNAME,
        @SchemaName SYSNAME,
        @Name SYSNAME,
        @ObjectId INT,
        @IsShipped BIT,
        @Missing NVARCHAR(200);

    -- 1. Validate parameters before any transaction starts.
    SET @AllowBareName = ISNULL(@AllowBareName, 0);

    -- PARSENAME takes a sysname: refuse what it would cut.
    IF DATALENGTH(@ProcedureName) BETWEEN 2 AND 256
        AND PARSENAME(@ProcedureName, 3) IS NULL
        AND PARSENAME(@ProcedureName, 4) IS NULL
        SELECT
            @Part1 = PARSENAME(@ProcedureName, 1),
            @Part2 = PARSENAME(@ProcedureName, 2);

    IF @Part2 IN (N'sys', N'INFORMATION_SCHEMA')
    BEGIN
        SET @Msg = CONCAT(N'@ProcedureName must not be a system procedure; got ', @ProcedureName, N'.');
        THROW 50311, @Msg, 1;
    END;

    SELECT
        @ObjectId = o.object_id,
        @SchemaName = s.name,
        @Name = o.name,
        @IsShipped = o.is_ms_shipped
    FROM sys.objects AS o
    INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
    WHERE
        s.name = @Part2
        AND o.name = @Part1
        AND o.type = 'P';

    IF @ObjectId IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@ProcedureName must be schema.procedure naming an existing SQL procedure of this database; got ',
            ISNULL(LEFT(@ProcedureName, 300), N'NULL'), N'.'
        );
        THROW 50310, @Msg, 1;
    END;

    IF @IsShipped = 1
    BEGIN
        SET @Msg = CONCAT(N'@ProcedureName must not be a system procedure; got ', @ProcedureName, N'.');
        THROW 50311, @Msg, 1;
    END;

    SELECT @Missing = STRING_AGG(c.ParameterName, N', ') WITHIN GROUP (ORDER BY c.ParameterName)
    FROM (
        VALUES (N'@SPName'), (N'@Param1'), (N'@Param2'), (N'@Param3'), (N'@Param4'), (N'@Param5')
    ) AS c(ParameterName)
    WHERE NOT EXISTS (
        SELECT 1 FROM sys.parameters AS p
        WHERE p.object_id = @ObjectId AND p.name = c.ParameterName
    );

    IF @Missing IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@ProcedureName ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
            N' must take the target contract''s parameters; it lacks ', @Missing, N'.'
        );
        THROW 50312, @Msg, 1;
    END;

    -- 2. Own the transaction, or nest in the caller's with a savepoint.
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0
            BEGIN TRANSACTION;
        ELSE
            SAVE TRANSACTION AllowProcedure;

        -- UPDLOCK, HOLDLOCK: the range lock keeps two sessions from both
        -- seeing the bare name free (insert-if-absent).
        IF @AllowBareName = 1 AND EXISTS (
            SELECT 1
            FROM delay.AllowedProcedure AS ap WITH (UPDLOCK, HOLDLOCK)
            WHERE
                ap.ProcedureName = @Name
                AND ap.AllowBareName = 1
                AND ap.SchemaName <> @SchemaName
        )
        BEGIN
            SET @Msg = CONCAT(
                N'@AllowBareName = 1, but the bare name ', @Name,
                N' already resolves to another schema''s procedure; disallow that entry first.'
            );
            THROW 50313, @Msg, 1;
        END;

        -- UPDLOCK, HOLDLOCK: update-else-insert without a race between the two.
        UPDATE ap
        SET
            ObjectId = @ObjectId,
            AllowBareName = @AllowBareName,
            ListedAtUtc = SYSUTCDATETIME(),
            ListedBy = ORIGINAL_LOGIN()
        FROM delay.AllowedProcedure AS ap WITH (UPDLOCK, HOLDLOCK)
        WHERE ap.SchemaName = @SchemaName AND ap.ProcedureName = @Name;

        IF @@ROWCOUNT = 0
            INSERT INTO delay.AllowedProcedure (SchemaName, ProcedureName, ObjectId, AllowBareName)
            VALUES (@SchemaName, @Name, @ObjectId, @AllowBareName);

        IF @TranCount = 0
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION AllowProcedure;   -- undo only our work
        THROW;
    END CATCH;

    SELECT
        ap.AllowedProcedureId,
        ap.SchemaName,
        ap.ProcedureName,
        ap.ObjectId,
        ap.AllowBareName
    FROM delay.AllowedProcedure AS ap
    WHERE ap.SchemaName = @SchemaName AND ap.ProcedureName = @Name;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
dbo.CancelDelayExecution: cancels a task that has not started: its receipt
becomes 4, its conversation ends (which drops its timer), and it never runs.
Parameters:  @TaskID BIGINT, required: the ID InitiateDelayExecution returned
             (dbo.tabDIYTable12402.ID)
Result set:  none.
Errors:      50320 @TaskID missing or names no scheduled task
             50321 the task is not Scheduled or Retrying (already running or
                   finished; the message names its state)
Transaction: joins the caller's via a savepoint, else opens its own.
Locks:       takes the task's conversation group first (BEGIN CONVERSATION
             TIMER locks it), then the task row with UPDLOCK, the order that
             dbo.ProcessDelayQueue uses, so the two never deadlock on a task.
             The 1-second timer is harmless: if the task turns out not to be
             cancellable, the rollback to our savepoint restores the timer.
Security:    EXECUTE AS OWNER: END CONVERSATION needs the conversation's owner
             (dbo, who began it in the trigger); callers need only EXECUTE
             (role MailqDelayCaller).
Example:     EXEC dbo.CancelDelayExecution @TaskID = 42;
*/
CREATE OR ALTER PROCEDURE dbo.CancelDelayExecution
    @TaskID BIGINT
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE
        @Msg NVARCHAR(2048),
        @Handle UNIQUEIDENTIFIER,
        @TaskState NVARCHAR(16);

    -- 1. Validate parameters before any transaction starts.
    SELECT
        @Handle = t.ConversationHandle,
        @TaskState = t.TaskState
    FROM delay.Task AS t
    WHERE t.TaskID = @TaskID;

    IF @TaskState IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID names no delayed task; got ', ISNULL(CAST(@TaskID AS NVARCHAR(20)), N'NULL'), N'.'
        );
        THROW 50320, @Msg, 1;
    END;

    IF @TaskState NOT IN (N'Scheduled', N'Retrying') OR @Handle IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@TaskID ', @TaskID, N' is ', @TaskState,
            N'; only a Scheduled or Retrying task can be cancelled.'
        );
        THROW 50321, @Msg, 1;
    END;

    -- 2. Own the transaction, or nest in the caller's with a savepoint.
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0
            BEGIN TRANSACTION;
        ELSE
            SAVE TRANSACTION CancelDelayExecution;

        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = 1;

        -- UPDLOCK: hold the row from this check to the state change, so the
        -- activation procedure cannot start the task in between.
        -- ROWLOCK: one task, one row lock.
        SELECT @TaskState = t.TaskState
        FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
        WHERE t.TaskID = @TaskID;

        IF @TaskState NOT IN (N'Scheduled', N'Retrying')
        BEGIN
            SET @Msg = CONCAT(
                N'@TaskID ', @TaskID, N' is ', @TaskState,
                N'; only a Scheduled or Retrying task can be cancelled.'
            );
            THROW 50321, @Msg, 1;
        END;

        SET @Msg = CONCAT(N'cancelled by ', ORIGINAL_LOGIN());
        EXEC delay.FinishTask
            @TaskID = @TaskID,
            @TaskState = N'Cancelled',
            @EventName = N'Cancelled',
            @ErrorMessage = @Msg;

        IF @TranCount = 0
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION CancelDelayExecution;   -- undo only our work
        THROW;
    END CATCH;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS delay.CancelTask;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
dbo.InitiateDelayExecution: schedules one allow-listed procedure to run after a
delay; inserts one row into dbo.tabDIYTable12402, whose trigger schedules it.
Parameters (the source document's names and order):
    @F108211 NVARCHAR(4000)  target procedure: N'schema.proc', or a bare N'proc'
                             listed with AllowBareName = 1 (see delay.AllowProcedure)
    @F108218 INT             delay in seconds, 0-31,536,000 (365 days)
    @F108212 ... @F108216 NVARCHAR(MAX) = NULL: the target's @Param1 ... @Param5,
                             at most 200 characters each (the target's contract)
    @F108210 NVARCHAR(50) = NULL   description (the platform's F108210)
    @TaskID  BIGINT = NULL OUTPUT  the new task's ID (dbo.tabDIYTable12402.ID)
Result set:  one row, one column: TaskID BIGINT (the same value as @TaskID), for
             clients that read a result rather than an OUTPUT parameter.
Errors:      50301 @F108211 missing; 50302 @F108218 outside 0-31,536,000;
             50303 a parameter longer than 200 characters;
             50304 @F108211 malformed or longer than 128 characters;
             50305 @F108211 has three or four parts; 50306 not on the allow-list;
             50307 listed, but the procedure was dropped, recreated or moved
Transaction: joins the caller's via a savepoint, else opens its own.  The task
             is scheduled when that transaction commits; if it rolls back,
             nothing is scheduled.
Security:    EXECUTE AS OWNER (dbo) so that name resolution sees every procedure
             in sys.objects; callers need only EXECUTE (role MailqDelayCaller).
Example:     DECLARE @TaskID BIGINT;
             EXEC dbo.InitiateDelayExecution @F108211 = N'dbo.TCXG', @F108218 = 60,
                 @F108212 = N'A-1', @TaskID = @TaskID OUTPUT;
*/
CREATE OR ALTER PROCEDURE dbo.InitiateDelayExecution
    @F108211 NVARCHAR(4000),
    @F108218 INT,
    @F108212 NVARCHAR(MAX) = NULL,
    @F108213 NVARCHAR(MAX) = NULL,
    @F108214 NVARCHAR(MAX) = NULL,
    @F108215 NVARCHAR(MAX) = NULL,
    @F108216 NVARCHAR(MAX) = NULL,
    @F108210 NVARCHAR(50) = NULL,
    @TaskID BIGINT = NULL OUTPUT
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE
        @Msg NVARCHAR(2048),
        @MaxDelaySeconds INT = 31536000,
        @BadParameter SYSNAME,
        @BadLength BIGINT,
        @Refusal INT,
        @RefusalMessage NVARCHAR(400),
        @TaskState NVARCHAR(16);

    SET @TaskID = NULL;

    -- 1. Validate parameters before any transaction starts.
    IF NULLIF(@F108211, N'') IS NULL
        THROW 50301, N'@F108211 (target procedure name) is required.', 1;

    IF @F108218 IS NULL OR @F108218 NOT BETWEEN 0 AND @MaxDelaySeconds
    BEGIN
        SET @Msg = CONCAT(
            N'@F108218 (delay) must be 0-', @MaxDelaySeconds, N' seconds; got ',
            ISNULL(CAST(@F108218 AS NVARCHAR(20)), N'NULL'), N'.'
        );
        THROW 50302, @Msg, 1;
    END;

    SELECT TOP (1)
        @BadParameter = v.ParameterName,
        @BadLength = v.ValueLength
    FROM (
        VALUES
        (N'@F108212', LEN(@F108212)),
        (N'@F108213', LEN(@F108213)),
        (N'@F108214', LEN(@F108214)),
        (N'@F108215', LEN(@F108215)),
        (N'@F108216', LEN(@F108216))
    ) AS v(ParameterName, ValueLength)
    WHERE v.ValueLength > 200
    ORDER BY v.ParameterName;

    IF @BadParameter IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(
            @BadParameter, N' must be at most 200 characters (the target''s @Param contract); got ',
            @BadLength, N'.'
        );
        THROW 50303, @Msg, 1;
    END;

    SELECT
        @Refusal = r.RefusalNumber,
        @RefusalMessage = r.RefusalMessage
    FROM delay.ResolveTarget(@F108211) AS r;

    IF @Refusal IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(N'@F108211: ', @RefusalMessage, N'.');
        THROW @Refusal, @Msg, 1;
    END;

    -- 2. Own the transaction, or nest in the caller's with a savepoint.
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0
            BEGIN TRANSACTION;
        ELSE
            SAVE TRANSACTION InitiateDelayExecution;

        INSERT INTO dbo.tabDIYTable12402 (
            F108210, F108211, F108212, F108213, F108214, F108215, F108216, F108218, F108219
        )
        VALUES (@F108210, @F108211, @F108212, @F108213, @F108214, @F108215, @F108216, @F108218, 0);

        -- SCOPE_IDENTITY, not @@IDENTITY: the trigger inserts into delay.Log,
        -- which has an identity of its own.
        SET @TaskID = CAST(SCOPE_IDENTITY() AS BIGINT);

        -- The trigger resolved the name again; the allow-list may have changed
        -- in between.
        SELECT
            @TaskState = t.TaskState,
            @Refusal = t.LastErrorNumber,
            @RefusalMessage = t.LastErrorMessage
        FROM delay.Task AS t
        WHERE t.TaskID = @TaskID;

        IF @TaskState IS NULL OR @TaskState <> N'Scheduled'
        BEGIN
            SET @Msg = CONCAT(N'@F108211: ', ISNULL(@RefusalMessage, N'the task was not scheduled'), N'.');
            SET @Refusal = ISNULL(@Refusal, 50306);
            THROW @Refusal, @Msg, 1;
        END;

        IF @TranCount = 0
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION InitiateDelayExecution;   -- undo only our work
        SET @TaskID = NULL;
        THROW;
    END CATCH;

    SELECT TaskID = @TaskID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
dbo.trg_tabDIYTable12402_ScheduleDelay: schedules every row inserted into the
platform's table; executes nothing.
Rows:        a row whose receipt F108219 is non-zero, or whose name F108211 is
             NULL, is ignored (no bookkeeping, no conversation).
             Every other row gets a delay.Task row, written set-based:
               refused (receipt 2, a delay.Log row, never run) when the delay is
               not 0-31,536,000 s (50302), a parameter is longer than 200
               characters (50303), or the name does not resolve through
               delay.ResolveTarget (50304-50307);
               scheduled otherwise: its own dialog (BEGIN DIALOG per row: a
               conversation per task), then a conversation timer of the delay
               (chained by day above 86,400 s), or for a delay of 0 a
               DelayRequest message, which is received at once.
             A bad row never makes the INSERT fail: it is refused, and the
             other rows are scheduled.  A NULL delay counts as 0.
Transaction: the inserting statement's.  Broker operations are transactional:
             if the INSERT's transaction rolls back, no dialog, timer or message
             remains, and nothing runs.
Security:    WITH EXECUTE AS OWNER (dbo): BEGIN DIALOG needs RECEIVE on the
             queue and REFERENCES on the contract, which ownership chaining does
             not provide; the platform's own login needs only INSERT on the table.
Example:     INSERT INTO dbo.tabDIYTable12402 (F108211, F108218, F108212)
             VALUES (N'TCXG', 60, N'A-1');
*/
CREATE OR ALTER TRIGGER dbo.trg_tabDIYTable12402_ScheduleDelay
ON dbo.tabDIYTable12402
WITH EXECUTE AS OWNER
AFTER INSERT
AS
BEGIN
    SET NOCOUNT ON;

    IF NOT EXISTS (SELECT 1 FROM inserted)
        RETURN;

    DECLARE
        @Now DATETIME2(3) = SYSUTCDATETIME(),
        -- 365 days; InitiateDelayExecution accepts the same range (50302).
        @MaxDelaySeconds INT = 31536000,
        -- A conversation timer never exceeds one day; dbo.ProcessDelayQueue
        -- re-arms a longer delay day by day.
        @MaxTimerSeconds INT = 86400,
        @TaskID BIGINT = NULL,
        @DelaySeconds INT,
        @Timeout INT,
        @Handle UNIQUEIDENTIFIER,
        @Body VARBINARY(8);

    DECLARE @New TABLE (
        TaskID BIGINT NOT NULL PRIMARY KEY,
        TargetName NVARCHAR(400) NULL,
        DelaySeconds INT NULL,
        RefusalNumber INT NULL,
        RefusalMessage NVARCHAR(400) NULL,
        SchemaName SYSNAME NULL,
        ProcedureName SYSNAME NULL
    );
    DECLARE @Scheduled TABLE (
        TaskID BIGINT NOT NULL PRIMARY KEY,
        ConversationHandle UNIQUEIDENTIFIER NOT NULL
    );

    -- 1. Classify every inserted row in one statement.
    WITH Candidate AS (
        SELECT
            TaskID = i.ID,
            TargetName = CAST(i.F108211 AS NVARCHAR(4000)),
            RawDelay = i.F108218,
            -- TRY_CONVERT: an adopted table may type F108218 otherwise; a value
            -- that is no integer is refused (50302) instead of failing the INSERT.
            DelaySeconds = CASE WHEN i.F108218 IS NULL THEN 0 ELSE TRY_CONVERT(INT, i.F108218) END,
            ParameterTooLong = CASE
                WHEN
                    LEN(i.F108212) > 200 OR LEN(i.F108213) > 200 OR LEN(i.F108214) > 200
                    OR LEN(i.F108215) > 200 OR LEN(i.F108216) > 200
                    THEN 1
                ELSE 0
            END
        FROM inserted AS i
        WHERE
            ISNULL(i.F108219, 0) = 0
            AND i.F108211 IS NOT NULL
    )

    INSERT INTO @New (TaskID, TargetName, DelaySeconds, RefusalNumber, RefusalMessage, SchemaName, ProcedureName)
    SELECT
        c.TaskID,
        LEFT(c.TargetName, 400),
        c.DelaySeconds,
        CASE
            WHEN c.DelaySeconds IS NULL OR c.DelaySeconds NOT BETWEEN 0 AND @MaxDelaySeconds THEN 50302
            WHEN c.ParameterTooLong = 1 THEN 50303
            ELSE r.RefusalNumber
        END,
        CASE
            WHEN c.DelaySeconds IS NULL OR c.DelaySeconds NOT BETWEEN 0 AND @MaxDelaySeconds
                THEN CONCAT(N'delay F108218 = ', c.RawDelay, N' is not 0-', @MaxDelaySeconds, N' seconds')
            WHEN c.ParameterTooLong = 1
                THEN N'a parameter F108212-F108216 is longer than the target''s 200 characters'
            ELSE r.RefusalMessage
        END,
        r.SchemaName,
        r.ProcedureName
    FROM Candidate AS c
    CROSS APPLY delay.ResolveTarget(c.TargetName) AS r;

    IF NOT EXISTS (SELECT 1 FROM @New)
        RETURN;

    -- An ID used again (the platform truncated its table and the identity
    -- restarted): the old bookkeeping refers to a row that is gone.  Its
    -- conversation, if still open, finds no task and is ended when its timer
    -- fires.
    -- (Not DELETE ... OUTPUT INTO delay.Log: an OUTPUT INTO target may not
    -- have CHECK constraints.)
    INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle)
    SELECT
        t.TaskID, N'Cancelled', t.TargetName, t.Attempts, 50332,
        N'the platform row was replaced by a new row with the same ID', t.ConversationHandle
    FROM delay.Task AS t
    INNER JOIN @New AS n ON t.TaskID = n.TaskID;

    DELETE t
    FROM delay.Task AS t
    INNER JOIN @New AS n ON t.TaskID = n.TaskID;

    -- 2. Bookkeeping, set-based: every row, scheduled or refused.
    INSERT INTO delay.Task (
        TaskID, TargetName, SchemaName, ProcedureName, DelaySeconds, TaskState,
        CreatedAtUtc, DueAtUtc, NextRunAtUtc, FinishedAtUtc, LastErrorNumber, LastErrorMessage
    )
    SELECT
        n.TaskID,
        n.TargetName,
        n.SchemaName,
        n.ProcedureName,
        n.DelaySeconds,
        IIF(n.RefusalNumber IS NULL, N'Scheduled', N'Refused'),
        @Now,
        IIF(n.RefusalNumber IS NULL, DATEADD(SECOND, n.DelaySeconds, @Now), NULL),
        IIF(n.RefusalNumber IS NULL, DATEADD(SECOND, n.DelaySeconds, @Now), NULL),
        IIF(n.RefusalNumber IS NULL, NULL, @Now),
        n.RefusalNumber,
        n.RefusalMessage
    FROM @New AS n;

    INSERT INTO delay.Log (TaskID, EventName, TargetName, ErrorNumber, ErrorMessage)
    SELECT n.TaskID, N'Refused', n.TargetName, n.RefusalNumber, n.RefusalMessage
    FROM @New AS n
    WHERE n.RefusalNumber IS NOT NULL;

    -- By ID: never by parameter values.  An UPDATE does not fire this
    -- AFTER INSERT trigger again.
    UPDATE p
    SET F108219 = 2
    FROM dbo.tabDIYTable12402 AS p
    INNER JOIN @New AS n ON p.ID = n.TaskID
    WHERE n.RefusalNumber IS NOT NULL;

    -- 3. One conversation per scheduled row: BEGIN DIALOG has no set form.
    WHILE 1 = 1
    BEGIN
        SELECT TOP (1)
            @TaskID = n.TaskID,
            @DelaySeconds = n.DelaySeconds
        FROM @New AS n
        WHERE n.RefusalNumber IS NULL AND (@TaskID IS NULL OR n.TaskID > @TaskID)
        ORDER BY n.TaskID;

        IF @@ROWCOUNT = 0
            BREAK;

        BEGIN DIALOG CONVERSATION @Handle
            FROM SERVICE MailqDelayService
            TO SERVICE N'MailqDelayService', N'CURRENT DATABASE'
            ON CONTRACT MailqDelayContract
            WITH ENCRYPTION = OFF;

        IF @DelaySeconds = 0
        BEGIN
            -- No timer for 0: a message on the dialog is received at once.
            SET @Body = CAST(@TaskID AS BINARY(8));
            SEND ON CONVERSATION @Handle
                MESSAGE TYPE MailqDelayRequest (@Body);
        END;
        ELSE
        BEGIN
            SET @Timeout = IIF(@DelaySeconds > @MaxTimerSeconds, @MaxTimerSeconds, @DelaySeconds);
            BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
        END;

        INSERT INTO @Scheduled (TaskID, ConversationHandle) VALUES (@TaskID, @Handle);
    END;

    UPDATE t
    SET ConversationHandle = s.ConversationHandle
    FROM delay.Task AS t
    INNER JOIN @Scheduled AS s ON t.TaskID = s.TaskID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
dbo.ProcessDelayQueue: activation procedure of dbo.DelayServiceQueue; runs due
delayed tasks.  Service Broker starts it (EXECUTE AS OWNER, up to
MAX_QUEUE_READERS copies); it loops until the queue stays empty for
delay.Setting.ReceiveWaitMs, then returns.
Parameters:  none.  Result sets: none.
Messages:    DialogTimer (on a task's initiator handle): the delay, a retry's
                 backoff or the watchdog lease has expired
             MailqDelayRequest (on the target handle; body = task ID):
                 a task with delay 0, to run at once
             EndDialog, Error: end this side of the conversation; a task still
                 pending on it is failed (BrokerError)
Pattern:     DESIGN.md pattern (a), "receive, record, commit; then run":
             1. one transaction RECEIVEs one message, moves the task to Running,
                counts the attempt, sets the conversation timer to the lease
                (the watchdog) and COMMITs.  Only our own bookkeeping runs in a
                transaction that received a message, so no target can make it
                roll back.  (Service Broker disables a queue after five
                rollbacks in a row of transactions that received from it.)
             2. the target runs in a transaction of its own, through
                sp_executesql with the name built from catalog names
                (QUOTENAME) and every value passed as a parameter.  A target
                that throws or dooms its transaction (XACT_STATE() = -1) is
                rolled back; one that commits or rolls back our transaction
                itself raises 266 at its return (transaction count mismatch)
                and is failed without retry, because its work may already be
                committed; a slow one simply runs (nothing interrupts it).
             3. a new transaction records the outcome: Done (receipt 1, the
                conversation ends), or Retrying (a new conversation timer on the
                same conversation: backoff RetryBaseSeconds * 4^(n-1), capped at
                RetryMaxSeconds), or, after MaxAttempts runs, Failed (receipt 3,
                the conversation ends).
             Watchdog: while a task runs, its runner holds a session-owned
             application lock named for the task, taken in step 1 before its
             COMMIT (so no lease can expire between the commit and the lock).  When the lease timer fires
             and the lock is free, the runner is gone (its session ended
             mid-target): the attempt is failed (RunnerLost) and retried.  When
             the lock is held, the runner is alive and slow: the lease is
             extended and a Slow row is logged.
             Timers longer than one day are chained: a timer never exceeds
             86,400 s; when it fires early the task is re-armed for the rest.
             If our own bookkeeping fails, its transaction is rolled back once
             and the same message is received again in a fresh transaction
             that only records the failure and ends the conversation, so no
             message is ever rolled back twice by this procedure.
Locks:       every transaction here takes the conversation group first (RECEIVE,
             or BEGIN CONVERSATION TIMER in step 3), then the task row, the
             same order as dbo.CancelDelayExecution.  DEADLOCK_PRIORITY HIGH:
             in a deadlock with an application session, the application is
             the victim, not a transaction that received a message.
Errors:      none raised: failures go to delay.Log (docs/errors.md 503xx).
Example:     started by Service Broker; to drain by hand: EXEC dbo.ProcessDelayQueue;
*/
CREATE OR ALTER PROCEDURE dbo.ProcessDelayQueue
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET DEADLOCK_PRIORITY HIGH;

    DECLARE
        @Handle UNIQUEIDENTIFIER,
        @MessageType SYSNAME,
        @Body VARBINARY(MAX),
        @Now DATETIME2(3),
        @TaskID BIGINT,
        @TaskHandle UNIQUEIDENTIFIER,
        @TaskState NVARCHAR(16),
        @TargetName NVARCHAR(400),
        @NextRunAtUtc DATETIME2(3),
        @LeaseUntilUtc DATETIME2(3),
        @Attempts INT,
        @Attempt INT,
        @RemainingMs BIGINT,
        @Timeout INT,
        @Refusal INT,
        @RefusalMessage NVARCHAR(400),
        @SchemaName SYSNAME,
        @ProcedureName SYSNAME,
        @SPName NVARCHAR(200),
        @Param1 NVARCHAR(200),
        @Param2 NVARCHAR(200),
        @Param3 NVARCHAR(200),
        @Param4 NVARCHAR(200),
        @Param5 NVARCHAR(200),
        @Run BIT,
        @Retryable BIT,
        @Sql NVARCHAR(MAX),
        -- The target contract: (@SPName, @Param1 ... @Param5 NVARCHAR(200)).
        @ParameterList NVARCHAR(400) = CONCAT(
            N'@SPName NVARCHAR(200), @Param1 NVARCHAR(200), @Param2 NVARCHAR(200), ',
            N'@Param3 NVARCHAR(200), @Param4 NVARCHAR(200), @Param5 NVARCHAR(200)'
        ),
        @LockName NVARCHAR(255),
        @LockResult INT,
        @ErrorNumber INT,
        @ErrorMessage NVARCHAR(4000),
        @ErrorXml XML,
        @StepErrorNumber INT,
        @StepErrorMessage NVARCHAR(4000),
        @Backoff BIGINT,
        @Recorded BIT,
        @Try INT,
        @MaxAttempts INT,
        @RetryBaseSeconds INT,
        @RetryMaxSeconds INT,
        @LeaseSeconds INT,
        @ReceiveWaitMs INT;

    DECLARE
        @DialogTimer SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer',
        @EndDialog SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog',
        @BrokerError SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/Error',
        @DelayRequest SYSNAME = N'MailqDelayRequest',
        -- A conversation timer never exceeds one day; longer delays are chained.
        @MaxTimerSeconds INT = 86400,
        -- A timer that fires less than this before the due time counts as due
        -- (timers have whole-second resolution).
        @EarlyToleranceMs INT = 500;

    WHILE 1 = 1
    BEGIN
        SELECT
            @Handle = NULL,
            @MessageType = NULL,
            @Body = NULL,
            @TaskID = NULL,
            @TaskHandle = NULL,
            @TaskState = NULL,
            @Run = 0,
            @MaxAttempts = 3,
            @RetryBaseSeconds = 30,
            @RetryMaxSeconds = 3600,
            @LeaseSeconds = 600,
            @ReceiveWaitMs = 5000;

        SELECT
            @MaxAttempts = s.MaxAttempts,
            @RetryBaseSeconds = s.RetryBaseSeconds,
            @RetryMaxSeconds = s.RetryMaxSeconds,
            @LeaseSeconds = s.LeaseSeconds,
            @ReceiveWaitMs = s.ReceiveWaitMs
        FROM delay.Setting AS s
        WHERE s.SettingId = 1;

        ------------------------------------------------------------------
        -- 1. Receive one message and do the bookkeeping; commit.
        ------------------------------------------------------------------
        SELECT @LockResult = -1, @LockName = NULL;  -- no run lock held yet
        BEGIN TRY
            BEGIN TRANSACTION;

            -- WAITFOR (RECEIVE ...), TIMEOUT: waits up to @ReceiveWaitMs
            -- milliseconds for a message; no message means the reader exits.
            -- RECEIVE locks the message's conversation group until COMMIT.
            WAITFOR (
                RECEIVE TOP (1)
                    @Handle = conversation_handle,
                    @MessageType = message_type_name,
                    @Body = message_body
                FROM dbo.DelayServiceQueue
            ), TIMEOUT @ReceiveWaitMs;

            IF @Handle IS NULL
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            SET @Now = SYSUTCDATETIME();

            IF @MessageType = @DelayRequest
                SET @TaskID = CAST(@Body AS BIGINT);
            ELSE
                SELECT @TaskID = t.TaskID
                FROM delay.Task AS t
                WHERE t.ConversationHandle = @Handle;

            -- UPDLOCK: hold the row for this state transition, so a cancel or
            -- another reader cannot move the task between our read and write.
            -- ROWLOCK: one task, one row lock.
            SELECT
                @TaskState = t.TaskState,
                @TaskHandle = t.ConversationHandle,
                @TargetName = t.TargetName,
                @NextRunAtUtc = t.NextRunAtUtc,
                @LeaseUntilUtc = t.LeaseUntilUtc,
                @Attempts = t.Attempts
            FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
            WHERE t.TaskID = @TaskID;

            IF @MessageType IN (@EndDialog, @BrokerError)
            BEGIN
                IF @MessageType = @BrokerError
                BEGIN
                    -- The body of an Error message is
                    -- <Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error">
                    --   <Code>n</Code><Description>text</Description></Error>
                    -- (*: matches that namespace without declaring it.)
                    SET @ErrorXml = CAST(@Body AS XML);
                    SELECT
                        @ErrorNumber = @ErrorXml.value('(/*:Error/*:Code)[1]', 'INT'),
                        @ErrorMessage = @ErrorXml.value('(/*:Error/*:Description)[1]', 'NVARCHAR(4000)');
                END;
                ELSE
                    SELECT
                        @ErrorNumber = 50333,
                        @ErrorMessage = N'the conversation was ended by its other side before the task finished';

                IF @TaskState IN (N'Scheduled', N'Running', N'Retrying') AND @TaskHandle = @Handle
                    -- Ends @Handle, the task's own conversation.
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'BrokerError',
                        @ErrorNumber = @ErrorNumber,
                        @ErrorMessage = @ErrorMessage;
                ELSE
                    -- The target side of a delay-0 dialog, or a conversation
                    -- whose task is already final: just end this side.
                    END CONVERSATION @Handle;
            END;
            ELSE IF @MessageType NOT IN (@DialogTimer, @DelayRequest)
                -- Not ours (nothing else is in the contract): drop the conversation.
                END CONVERSATION @Handle;
            ELSE IF @TaskState IS NULL
                -- No task (it was replaced or never recorded): nothing to run.
                END CONVERSATION @Handle;
            ELSE IF @TaskState IN (N'Done', N'Failed', N'Refused', N'Cancelled')
            BEGIN
                -- Final already.  A late timer ends its conversation; a late
                -- DelayRequest leaves the target side to the EndDialog that
                -- the initiator side's END CONVERSATION sent.
                IF @MessageType = @DialogTimer
                    END CONVERSATION @Handle;
            END;
            ELSE IF @MessageType = @DelayRequest AND @TaskState <> N'Scheduled'
                -- A run already started through the task's own conversation.
                SET @Run = 0;
            ELSE IF @MessageType = @DialogTimer AND @TaskState = N'Running'
            BEGIN
                SET @RemainingMs = DATEDIFF_BIG(MILLISECOND, @Now, @LeaseUntilUtc);
                IF @RemainingMs > @EarlyToleranceMs
                BEGIN
                    -- Early (chained or re-armed timer): wait for the rest of the lease.
                    SET @Timeout = CASE
                        WHEN @RemainingMs >= CAST(@MaxTimerSeconds AS BIGINT) * 1000 THEN @MaxTimerSeconds
                        ELSE CAST((@RemainingMs + 999) / 1000 AS INT)
                    END;
                    BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
                END;
                ELSE
                BEGIN
                    -- The lease expired: is the runner alive?  It holds this
                    -- session-owned lock for as long as the target runs; a
                    -- session that ended released it.
                    SET @LockName = CONCAT(N'mailq-db/delay/task/', @TaskID);
                    EXEC @LockResult = sys.sp_getapplock
                        @Resource = @LockName,
                        @LockMode = N'Exclusive',
                        @LockOwner = N'Session',
                        @LockTimeout = 0;

                    IF @LockResult < 0
                    BEGIN
                        -- Alive and slow: extend the lease, never interrupt.
                        UPDATE delay.Task
                        SET LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now)
                        WHERE TaskID = @TaskID;

                        SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;

                        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorMessage, ConversationHandle)
                        VALUES (
                            @TaskID, N'Slow', @TargetName, @Attempts,
                            CONCAT(N'attempt ', @Attempts, N' still running after its lease; lease extended by ',
                                @LeaseSeconds, N' s'),
                            @Handle
                        );
                    END;
                    ELSE
                    BEGIN
                        EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';

                        SET @ErrorMessage = CONCAT(
                            N'attempt ', @Attempts, N' ended without reporting: its session ended while the target ran'
                        );
                        IF @Attempts < @MaxAttempts
                        BEGIN
                            SET @Backoff = CAST(@RetryBaseSeconds AS BIGINT)
                                * POWER(CAST(4 AS BIGINT), IIF(@Attempts > 10, 10, @Attempts - 1));
                            SET @Timeout = CAST(IIF(@Backoff > @RetryMaxSeconds, @RetryMaxSeconds, @Backoff) AS INT);

                            UPDATE delay.Task
                            SET
                                TaskState = N'Retrying',
                                NextRunAtUtc = DATEADD(SECOND, @Timeout, @Now),
                                LeaseUntilUtc = NULL,
                                LastErrorNumber = 50331,
                                LastErrorMessage = @ErrorMessage
                            WHERE TaskID = @TaskID;

                            BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;

                            INSERT INTO delay.Log (
                                TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                            )
                            VALUES (@TaskID, N'RunnerLost', @TargetName, @Attempts, 50331, @ErrorMessage, @Handle);
                        END;
                        ELSE
                            EXEC delay.FinishTask
                                @TaskID = @TaskID,
                                @TaskState = N'Failed',
                                @EventName = N'RunnerLost',
                                @ErrorNumber = 50331,
                                @ErrorMessage = @ErrorMessage;
                    END;
                END;
            END;
            ELSE
            BEGIN
                -- Scheduled or Retrying, on its timer or its DelayRequest.
                SET @RemainingMs = DATEDIFF_BIG(MILLISECOND, @Now, @NextRunAtUtc);
                IF @MessageType = @DialogTimer AND @RemainingMs > @EarlyToleranceMs
                BEGIN
                    -- A chained timer of a delay longer than one day: re-arm for the rest.
                    SET @Timeout = CASE
                        WHEN @RemainingMs >= CAST(@MaxTimerSeconds AS BIGINT) * 1000 THEN @MaxTimerSeconds
                        ELSE CAST((@RemainingMs + 999) / 1000 AS INT)
                    END;
                    BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
                END;
                ELSE
                BEGIN
                    -- Due.  Resolve the name again: the allow-list or the
                    -- procedure may have changed since the row was scheduled.
                    SELECT
                        @Refusal = r.RefusalNumber,
                        @RefusalMessage = r.RefusalMessage,
                        @SchemaName = r.SchemaName,
                        @ProcedureName = r.ProcedureName
                    FROM delay.ResolveTarget(@TargetName) AS r;

                    IF @Refusal IS NOT NULL
                        EXEC delay.FinishTask
                            @TaskID = @TaskID,
                            @TaskState = N'Refused',
                            @EventName = N'Refused',
                            @ErrorNumber = @Refusal,
                            @ErrorMessage = @RefusalMessage;
                    ELSE
                    BEGIN
                        -- The values are read at run time, by the row's ID.
                        SELECT
                            @SPName = CAST(p.F108211 AS NVARCHAR(200)),
                            @Param1 = CAST(p.F108212 AS NVARCHAR(200)),
                            @Param2 = CAST(p.F108213 AS NVARCHAR(200)),
                            @Param3 = CAST(p.F108214 AS NVARCHAR(200)),
                            @Param4 = CAST(p.F108215 AS NVARCHAR(200)),
                            @Param5 = CAST(p.F108216 AS NVARCHAR(200))
                        FROM dbo.tabDIYTable12402 AS p
                        WHERE p.ID = @TaskID;

                        IF @@ROWCOUNT = 0
                            EXEC delay.FinishTask
                                @TaskID = @TaskID,
                                @TaskState = N'Cancelled',
                                @EventName = N'Cancelled',
                                @ErrorNumber = 50332,
                                @ErrorMessage = N'the platform row was deleted before the task ran';
                        ELSE
                        BEGIN
                            -- The run lock is taken here, before this
                            -- transaction commits the task as Running: a
                            -- watchdog that fires between that commit and the
                            -- target must find it held, or it would declare the
                            -- runner lost and start a second run (spin found
                            -- that race: models/delayexec.pml, delay-stale-runner).
                            -- Session-owned, so the COMMIT below keeps it;
                            -- released after step 3, or by the session's end.
                            SET @LockName = CONCAT(N'mailq-db/delay/task/', @TaskID);
                            EXEC @LockResult = sys.sp_getapplock
                                @Resource = @LockName,
                                @LockMode = N'Exclusive',
                                @LockOwner = N'Session',
                                @LockTimeout = 0;
                        END;

                        IF @LockResult < 0 AND @LockName IS NOT NULL
                        BEGIN
                            -- A runner of an earlier attempt still holds the
                            -- task: never run it twice at once.  Wait a lease.
                            SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                            BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                            INSERT INTO delay.Log (
                                TaskID, EventName, TargetName, Attempt, ErrorMessage, ConversationHandle
                            )
                            VALUES (
                                @TaskID, N'Slow', @TargetName, @Attempts,
                                N'an earlier run of this task still holds its run lock; '
                                + N'the next attempt waits a lease',
                                @Handle
                            );
                        END;
                        ELSE IF @LockName IS NOT NULL
                        BEGIN
                            SET @Attempt = @Attempts + 1;

                            UPDATE delay.Task
                            SET
                                TaskState = N'Running',
                                Attempts = @Attempt,
                                SchemaName = @SchemaName,
                                ProcedureName = @ProcedureName,
                                FirstStartedAtUtc = ISNULL(FirstStartedAtUtc, @Now),
                                LastStartedAtUtc = @Now,
                                NextRunAtUtc = NULL,
                                LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now)
                            WHERE TaskID = @TaskID;

                            -- The watchdog: on the task's own conversation
                            -- (for a DelayRequest, @Handle is the target side).
                            SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                            BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                            SET @Run = 1;
                        END;
                    END;
                END;
            END;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            SELECT @ErrorNumber = ERROR_NUMBER(), @ErrorMessage = ERROR_MESSAGE();
            -- The message goes back to the queue: one rollback of it.
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;
            -- A run lock taken in this step survives the rollback (it is
            -- session-owned): give it back, the task was not started.
            IF @LockResult >= 0 AND @LockName IS NOT NULL
                EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';
            SET @LockResult = -1;

            -- Nothing received (the queue itself failed, e.g. disabled): stop;
            -- activation starts a reader again when the queue works.
            IF @Handle IS NULL
                RETURN;

            -- Receive that message again in a fresh transaction that only
            -- records the failure and ends the conversation, so it is never
            -- rolled back a second time in a row by a retry of the same bug.
            BEGIN TRY
                BEGIN TRANSACTION;

                RECEIVE TOP (1) @Body = message_body
                FROM dbo.DelayServiceQueue
                WHERE conversation_handle = @Handle;

                SET @ErrorMessage = CONCAT(
                    N'dbo.ProcessDelayQueue failed on a ', @MessageType, N' message: ', @ErrorMessage
                );

                IF @TaskID IS NOT NULL AND EXISTS (
                    SELECT 1 FROM delay.Task AS t
                    WHERE t.TaskID = @TaskID AND t.TaskState IN (N'Scheduled', N'Running', N'Retrying')
                )
                BEGIN
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'BrokerError',
                        @ErrorNumber = @ErrorNumber,
                        @ErrorMessage = @ErrorMessage;
                    -- For a DelayRequest, @Handle is the target side; it ends
                    -- when the EndDialog that FinishTask caused arrives.
                END;
                ELSE
                BEGIN
                    INSERT INTO delay.Log (TaskID, EventName, ErrorNumber, ErrorMessage, ConversationHandle)
                    VALUES (@TaskID, N'BrokerError', @ErrorNumber, @ErrorMessage, @Handle);
                    END CONVERSATION @Handle;
                END;

                COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- Twice in a row: stop this reader rather than spin.  The
                -- message stays on the queue for a later reader.
                RETURN;
            END CATCH;

            SET @Run = 0;
        END CATCH;

        IF @Run = 0
            CONTINUE;

        ------------------------------------------------------------------
        -- 2. Run the target in its own transaction.
        ------------------------------------------------------------------
        -- This session holds the task's run lock since step 1 (session-owned:
        -- it survives the target's COMMIT or ROLLBACK; released below, or by
        -- the end of this session if it dies mid-target).
        SELECT @ErrorNumber = NULL, @ErrorMessage = NULL, @Retryable = 1;

        BEGIN
            -- Built from the catalog's names (delay.ResolveTarget checked the
            -- allow-list and the object's identity), each part QUOTENAMEd;
            -- the six values are parameters, never part of the text.
            SET @Sql = CONCAT(
                N'EXEC ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@ProcedureName),
                N' @SPName = @SPName, @Param1 = @Param1, @Param2 = @Param2,',
                N' @Param3 = @Param3, @Param4 = @Param4, @Param5 = @Param5;'
            );

            BEGIN TRY
                BEGIN TRANSACTION;

                EXEC sys.sp_executesql
                    @Sql,
                    @ParameterList,
                    @SPName = @SPName,
                    @Param1 = @Param1,
                    @Param2 = @Param2,
                    @Param3 = @Param3,
                    @Param4 = @Param4,
                    @Param5 = @Param5;

                IF @@TRANCOUNT > 1
                BEGIN
                    -- Left a transaction of its own open (normally 266 is raised first).
                    SELECT
                        @ErrorNumber = 50335,
                        @ErrorMessage = CONCAT(N'the target left ', @@TRANCOUNT - 1, N' transaction(s) open');
                    ROLLBACK TRANSACTION;
                END;
                ELSE IF @@TRANCOUNT = 1
                    COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                SELECT @ErrorNumber = ERROR_NUMBER(), @ErrorMessage = ERROR_MESSAGE();
                -- Doomed (-1) or not (1): the target's work is undone as a whole.
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- 266: the target committed or rolled back the transaction
                -- opened for it; what it did may be committed, so it is not
                -- run again.
                IF @ErrorNumber = 266
                    SELECT
                        @Retryable = 0,
                        @ErrorMessage = CONCAT(
                            N'the target committed or rolled back the transaction opened for it ',
                            N'(its work may be committed; not retried): ', @ErrorMessage
                        );
            END CATCH;
        END;

        ------------------------------------------------------------------
        -- 3. Record the outcome in a new transaction (retried on deadlock).
        ------------------------------------------------------------------
        SELECT @Recorded = 0, @Try = 0;
        WHILE @Recorded = 0 AND @Try < 3
        BEGIN
            SET @Try += 1;
            BEGIN TRY
                BEGIN TRANSACTION;

                -- Conversation group first (BEGIN CONVERSATION TIMER locks it),
                -- then the task row: the lock order of step 1.  It also keeps
                -- the watchdog armed until the outcome is committed.
                SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                SET @TaskState = NULL;
                -- UPDLOCK, ROWLOCK: as in step 1.
                SELECT
                    @TaskState = t.TaskState,
                    @Attempts = t.Attempts
                FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
                WHERE t.TaskID = @TaskID;

                SET @Now = SYSUTCDATETIME();

                IF @TaskState IS NULL OR @TaskState <> N'Running' OR @Attempts <> @Attempt
                BEGIN
                    -- Finished meanwhile (a broker Error) or the row is gone: keep that outcome.
                    IF @ErrorNumber IS NOT NULL
                        INSERT INTO delay.Log (
                            TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                        )
                        VALUES (@TaskID, N'Failed', @TargetName, @Attempt, @ErrorNumber, @ErrorMessage, @TaskHandle);
                END;
                ELSE IF @ErrorNumber IS NULL
                    EXEC delay.FinishTask @TaskID = @TaskID, @TaskState = N'Done';
                ELSE IF @Retryable = 1 AND @Attempt < @MaxAttempts
                BEGIN
                    SET @Backoff = CAST(@RetryBaseSeconds AS BIGINT)
                        * POWER(CAST(4 AS BIGINT), IIF(@Attempt > 10, 10, @Attempt - 1));
                    SET @Timeout = CAST(IIF(@Backoff > @RetryMaxSeconds, @RetryMaxSeconds, @Backoff) AS INT);

                    UPDATE delay.Task
                    SET
                        TaskState = N'Retrying',
                        NextRunAtUtc = DATEADD(SECOND, @Timeout, @Now),
                        LeaseUntilUtc = NULL,
                        LastErrorNumber = @ErrorNumber,
                        LastErrorMessage = @ErrorMessage
                    WHERE TaskID = @TaskID;

                    -- Replaces the lease: the retry is a new timer on the same conversation.
                    BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                    INSERT INTO delay.Log (
                        TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                    )
                    VALUES (@TaskID, N'Failed', @TargetName, @Attempt, @ErrorNumber, @ErrorMessage, @TaskHandle);
                END;
                ELSE
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'GaveUp',
                        @ErrorNumber = @ErrorNumber,
                        @ErrorMessage = @ErrorMessage;

                COMMIT TRANSACTION;
                SET @Recorded = 1;
            END TRY
            BEGIN CATCH
                SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- 1205: deadlock victim, try again.  Anything else (e.g. the
                -- conversation was ended by a broker Error meanwhile): stop
                -- trying; the task's state already says what happened, or the
                -- lease timer will find it Running with no runner.
                IF @StepErrorNumber <> 1205 OR @Try >= 3
                BEGIN
                    SET @Try = 3;
                    BEGIN TRY
                        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage)
                        VALUES (
                            @TaskID, N'BrokerError', @TargetName, @Attempt, @StepErrorNumber,
                            CONCAT(N'the outcome of attempt ', @Attempt, N' could not be recorded: ', @StepErrorMessage)
                        );
                    END TRY
                    BEGIN CATCH
                        -- Best effort: the lease timer still covers the task.
                        SET @Recorded = 0;
                    END CATCH;
                END;
            END CATCH;
        END;

        IF @LockResult >= 0
            EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';
    END;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
delay.FinishTask: moves a task to a final state, sets the platform's receipt,
logs the event and ends the task's conversation (which also drops its timer).
Parameters:  @TaskID       BIGINT, required
             @TaskState    NVARCHAR(16): Done, Failed, Refused or Cancelled
             @EventName    NVARCHAR(16) = NULL: the delay.Log event to write
                           (NULL writes none, e.g. for Done)
             @ErrorNumber  INT = NULL, @ErrorMessage NVARCHAR(4000) = NULL:
                           stored as the task's last error and in the log row
Receipt:     Done 1, Refused 2, Failed 3, Cancelled 4 (dbo.tabDIYTable12402.F108219)
Errors:      50399 called outside a transaction or with an unknown state (a bug)
Transaction: joins the caller's, which must exist: the state change and the
             END CONVERSATION commit or roll back together
Internal:    called by dbo.ProcessDelayQueue and dbo.CancelDelayExecution (both
             run as dbo); no role is granted EXECUTE.
Example:     EXEC delay.FinishTask @TaskID = 42, @TaskState = N'Done';
*/
CREATE OR ALTER PROCEDURE delay.FinishTask
    @TaskID BIGINT,
    @TaskState NVARCHAR(16),
    @EventName NVARCHAR(16) = NULL,
    @ErrorNumber INT = NULL,
    @ErrorMessage NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @@TRANCOUNT = 0 OR @TaskState IS NULL
        OR @TaskState NOT IN (N'Done', N'Failed', N'Refused', N'Cancelled')
    BEGIN
        SET @Msg = CONCAT(
            N'delay.FinishTask needs its caller''s transaction and a final @TaskState; got @@TRANCOUNT = ',
            @@TRANCOUNT, N', @TaskState = ', ISNULL(@TaskState, N'NULL'), N'.'
        );
        THROW 50399, @Msg, 1;
    END;

    DECLARE
        @Handle UNIQUEIDENTIFIER,
        @TargetName NVARCHAR(400),
        @Attempts INT;

    UPDATE delay.Task
    SET
        TaskState = @TaskState,
        FinishedAtUtc = SYSUTCDATETIME(),
        NextRunAtUtc = NULL,
        LeaseUntilUtc = NULL,
        LastErrorNumber = ISNULL(@ErrorNumber, LastErrorNumber),
        LastErrorMessage = ISNULL(@ErrorMessage, LastErrorMessage),
        @Handle = ConversationHandle,
        @TargetName = TargetName,
        @Attempts = Attempts
    WHERE TaskID = @TaskID;

    -- The receipt is set by the row's ID, never by matching parameter values
    -- (the source design's join on F108211-F108216 missed NULLs and marked
    -- rows with equal parameters together).
    UPDATE dbo.tabDIYTable12402
    SET F108219 = CASE @TaskState
        WHEN N'Done' THEN 1
        WHEN N'Refused' THEN 2
        WHEN N'Failed' THEN 3
        WHEN N'Cancelled' THEN 4
    END
    WHERE ID = @TaskID;

    IF @EventName IS NOT NULL
        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle)
        VALUES (@TaskID, @EventName, @TargetName, @Attempts, @ErrorNumber, @ErrorMessage, @Handle);

    -- Every task's conversation ends here, once: no endpoint is left behind.
    -- Ending the initiator side also discards its pending timer.
    IF @Handle IS NOT NULL
        END CONVERSATION @Handle;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
delay.ResolveTarget: resolves a requested target name against the allow-list
and sys.objects; the one place where a name becomes something executable.
Parameters:  @Name NVARCHAR(4000): a name as the caller or the platform wrote it
Result set:  exactly one row:
             RefusalNumber INT: NULL when the name resolves, else why not:
                 50304 empty, longer than 128 characters, or not a valid name
                 50305 a three- or four-part name (another database or server)
                 50306 not on the allow-list (delay.AllowedProcedure)
                 50307 listed, but sys.objects no longer holds that procedure
                       with the listed object_id, schema and name (dropped,
                       recreated, moved, or renamed): list it again
             RefusalMessage NVARCHAR(400): the reason in words, naming the value
             SchemaName, ProcedureName SYSNAME, ObjectId INT: the catalog's
                 names of the procedure to run (NULL when refused)
Rules:       "schema.proc" matches the entry with that schema and name only.
             A bare "proc" matches only the entry listed with AllowBareName = 1
             (at most one per name); it never resolves through a default schema.
             Names are compared, never executed: an injected string such as
             N'x];DROP TABLE t;--' or N'dbo.p; EXEC xp_cmdshell ''x''' matches no
             listed procedure.  The caller builds the EXEC from the returned
             catalog names with QUOTENAME.
             PARSENAME takes a sysname (NVARCHAR(128)) and would silently cut a
             longer string, so longer names are refused before it is called.
             Runs in its caller's security context (an inline function): the
             callers run as dbo (EXECUTE AS OWNER) and so see every procedure.
Example:     SELECT RefusalNumber, SchemaName, ProcedureName, ObjectId
             FROM delay.ResolveTarget(N'dbo.TCXG');
*/
CREATE OR ALTER FUNCTION delay.ResolveTarget(@Name NVARCHAR(4000))
RETURNS TABLE
AS
RETURN
SELECT
    RefusalNumber = CASE
        WHEN n.Part1 IS NULL THEN 50304
        WHEN n.Part3 IS NOT NULL OR n.Part4 IS NOT NULL THEN 50305
        WHEN a.AllowedProcedureId IS NULL THEN 50306
        WHEN o.object_id IS NULL THEN 50307
    END,
    RefusalMessage = CASE
        WHEN n.Part1 IS NULL THEN CONCAT(
                N'target name "', LEFT(@Name, 200), N'" is empty, longer than 128 characters or not a valid name'
            )
        WHEN n.Part3 IS NOT NULL OR n.Part4 IS NOT NULL THEN CONCAT(
                N'target name "', LEFT(@Name, 200),
                N'" has three or four parts; only schema.procedure or a bare name is allowed'
            )
        WHEN a.AllowedProcedureId IS NULL THEN CONCAT(
                N'target name "', LEFT(@Name, 200), N'" is not on the allow-list (delay.AllowedProcedure)'
            )
        WHEN o.object_id IS NULL THEN CONCAT(
                N'target name "', LEFT(@Name, 200), N'" was listed as ', QUOTENAME(a.SchemaName), N'.',
                QUOTENAME(a.ProcedureName), N', which no longer exists with the listed identity; list it again'
            )
    END,
    SchemaName = CASE WHEN o.object_id IS NOT NULL THEN a.SchemaName END,
    ProcedureName = CASE WHEN o.object_id IS NOT NULL THEN a.ProcedureName END,
    ObjectId = o.object_id
FROM (
    SELECT
        Part1 = CASE WHEN ok.IsShort = 1 THEN PARSENAME(@Name, 1) END,
        Part2 = CASE WHEN ok.IsShort = 1 THEN PARSENAME(@Name, 2) END,
        Part3 = CASE WHEN ok.IsShort = 1 THEN PARSENAME(@Name, 3) END,
        Part4 = CASE WHEN ok.IsShort = 1 THEN PARSENAME(@Name, 4) END
    FROM (
        -- DATALENGTH, not LEN: LEN ignores trailing blanks.  2-256 bytes = 1-128 characters.
        SELECT IsShort = CASE WHEN DATALENGTH(@Name) BETWEEN 2 AND 256 THEN 1 ELSE 0 END
    ) AS ok
) AS n
OUTER APPLY (
    -- At most one row: (SchemaName, ProcedureName) is unique, and so is
    -- ProcedureName among the entries that allow a bare name.
    SELECT
        ap.AllowedProcedureId,
        ap.SchemaName,
        ap.ProcedureName,
        ap.ObjectId
    FROM delay.AllowedProcedure AS ap
    WHERE
        n.Part3 IS NULL
        AND n.Part4 IS NULL
        AND ap.ProcedureName = n.Part1
        AND (ap.SchemaName = n.Part2 OR (n.Part2 IS NULL AND ap.AllowBareName = 1))
) AS a
LEFT OUTER JOIN sys.objects AS o
    ON
        a.ObjectId = o.object_id
        AND o.type = 'P'
        AND o.is_ms_shipped = 0
        AND a.ProcedureName = o.name
        AND o.schema_id = SCHEMA_ID(a.SchemaName);

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS delay.Incident;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Task') IS NOT NULL
    DROP INDEX IF EXISTS UX_Task_IdempotencyKey ON delay.Task;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
delay.Task: the bookkeeping of every scheduled row of dbo.tabDIYTable12402,
kept beside the platform's table rather than in it.
    TaskID             = dbo.tabDIYTable12402.ID (the task ID InitiateDelayExecution returns)
    ConversationHandle the initiator handle of the task's own dialog: its
                       conversation timer is the delay, the retry backoff and
                       the watchdog lease in turn; NULL for refused rows
    TaskState          Scheduled -> Running -> Done
                                           -> Retrying -> Running ... -> Failed
                       Scheduled/Retrying -> Cancelled; new row -> Refused
    Receipt            what the platform's F108219 is set to:
                       0 pending (Scheduled, Running, Retrying), 1 Done,
                       2 Refused, 3 Failed (attempts exhausted or not retryable),
                       4 Cancelled
    DueAtUtc           CreatedAtUtc + delay: when the task should first run
    NextRunAtUtc       when it runs next (DueAtUtc, then each retry's time)
    LeaseUntilUtc      while Running: when the watchdog looks at the runner
    FirstStartedAtUtc  the first run's start (lateness = this - DueAtUtc)
Rows are written by the trigger on dbo.tabDIYTable12402 (set-based), by
dbo.ProcessDelayQueue and by dbo.CancelDelayExecution only.
*/
IF OBJECT_ID(N'delay.Task', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Task (
        TaskID BIGINT NOT NULL,
        ConversationHandle UNIQUEIDENTIFIER NULL,
        TargetName NVARCHAR(400) NULL,
        SchemaName SYSNAME NULL,
        ProcedureName SYSNAME NULL,
        DelaySeconds INT NULL,
        TaskState NVARCHAR(16) NOT NULL,
        Receipt AS CAST(CASE TaskState
                WHEN N'Done' THEN 1
                WHEN N'Refused' THEN 2
                WHEN N'Failed' THEN 3
                WHEN N'Cancelled' THEN 4
                ELSE 0
            END AS TINYINT),
        Attempts INT NOT NULL CONSTRAINT DF_Task_Attempts DEFAULT (0),
        CreatedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Task_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        DueAtUtc DATETIME2(3) NULL,
        NextRunAtUtc DATETIME2(3) NULL,
        LeaseUntilUtc DATETIME2(3) NULL,
        FirstStartedAtUtc DATETIME2(3) NULL,
        LastStartedAtUtc DATETIME2(3) NULL,
        FinishedAtUtc DATETIME2(3) NULL,
        LastErrorNumber INT NULL,
        LastErrorMessage NVARCHAR(4000) NULL,
        CONSTRAINT PK_Task PRIMARY KEY CLUSTERED (TaskID),
        CONSTRAINT CK_Task_TaskState CHECK (
            TaskState IN (N'Scheduled', N'Running', N'Retrying', N'Done', N'Failed', N'Refused', N'Cancelled')
        ),
        CONSTRAINT CK_Task_Attempts CHECK (Attempts >= 0)
    );
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
delay.AllowedProcedure: the allow-list of procedures that delayed execution may run.
An entry is a schema-qualified procedure and the object_id it had when it was
listed (delay.AllowProcedure).  At call time and again at execution time a name
resolves only if the entry exists AND sys.objects still holds a SQL procedure
with that object_id, schema and name: a procedure dropped and recreated (even
under the same name) must be listed again.
AllowBareName = 1 lets a one-part name (the platform stores bare names such as
N'TCXG') resolve to this entry; at most one entry per bare name may allow it
(UX_AllowedProcedure_BareName).  A bare name never resolves through anybody's
default schema.
*/
IF OBJECT_ID(N'delay.AllowedProcedure', N'U') IS NULL
BEGIN
    CREATE TABLE delay.AllowedProcedure (
        AllowedProcedureId INT IDENTITY (1, 1) NOT NULL,
        SchemaName SYSNAME NOT NULL,
        ProcedureName SYSNAME NOT NULL,
        ObjectId INT NOT NULL,
        AllowBareName BIT NOT NULL
            CONSTRAINT DF_AllowedProcedure_AllowBareName DEFAULT (0),
        ListedAtUtc DATETIME2(3) NOT NULL
            CONSTRAINT DF_AllowedProcedure_ListedAtUtc DEFAULT (SYSUTCDATETIME()),
        ListedBy NVARCHAR(128) NOT NULL
            CONSTRAINT DF_AllowedProcedure_ListedBy DEFAULT (ORIGINAL_LOGIN()),
        CONSTRAINT PK_AllowedProcedure PRIMARY KEY CLUSTERED (AllowedProcedureId),
        CONSTRAINT UQ_AllowedProcedure_SchemaName_ProcedureName UNIQUE (SchemaName, ProcedureName)
    );
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
delay.Setting: the retry and lease policy of dbo.ProcessDelayQueue, one row.
    MaxAttempts        runs of a failing target before it is given up (receipt 3)
    RetryBaseSeconds   backoff before retry n: RetryBaseSeconds * 4^(n-1) ...
    RetryMaxSeconds    ... capped at RetryMaxSeconds
    LeaseSeconds       watchdog: if a run has not reported after this long, the
                       activation procedure checks whether its runner is alive
                       (slow: the lease is extended and logged) or gone
                       (the attempt failed: retried or given up)
    ReceiveWaitMs      how long an idle reader waits in WAITFOR (RECEIVE) before
                       it exits (activation starts readers again on demand)
Operators change it with UPDATE (db_owner); the procedures read it at each message.
*/
IF OBJECT_ID(N'delay.Setting', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Setting (
        SettingId TINYINT NOT NULL CONSTRAINT DF_Setting_SettingId DEFAULT (1),
        MaxAttempts INT NOT NULL CONSTRAINT DF_Setting_MaxAttempts DEFAULT (3),
        RetryBaseSeconds INT NOT NULL CONSTRAINT DF_Setting_RetryBaseSeconds DEFAULT (30),
        RetryMaxSeconds INT NOT NULL CONSTRAINT DF_Setting_RetryMaxSeconds DEFAULT (3600),
        LeaseSeconds INT NOT NULL CONSTRAINT DF_Setting_LeaseSeconds DEFAULT (600),
        ReceiveWaitMs INT NOT NULL CONSTRAINT DF_Setting_ReceiveWaitMs DEFAULT (5000),
        CONSTRAINT PK_Setting PRIMARY KEY CLUSTERED (SettingId),
        CONSTRAINT CK_Setting_SingleRow CHECK (SettingId = 1),
        CONSTRAINT CK_Setting_MaxAttempts CHECK (MaxAttempts BETWEEN 1 AND 100),
        CONSTRAINT CK_Setting_RetryBaseSeconds CHECK (RetryBaseSeconds BETWEEN 1 AND 86400),
        CONSTRAINT CK_Setting_RetryMaxSeconds CHECK (RetryMaxSeconds BETWEEN 1 AND 86400),
        CONSTRAINT CK_Setting_LeaseSeconds CHECK (LeaseSeconds BETWEEN 1 AND 86400),
        CONSTRAINT CK_Setting_ReceiveWaitMs CHECK (ReceiveWaitMs BETWEEN 100 AND 60000)
    );

    INSERT INTO delay.Setting (SettingId) VALUES (1);
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Task', N'U') IS NOT NULL AND OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') IS NOT NULL
    ALTER TABLE delay.Task DROP COLUMN IF EXISTS IdempotencyKey, CreatedBy;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Setting', N'U') IS NOT NULL AND OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') IS NOT NULL
    ALTER TABLE delay.Setting DROP CONSTRAINT IF EXISTS CK_Setting_TargetLockTimeoutMs;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Setting', N'U') IS NOT NULL AND OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') IS NOT NULL
    ALTER TABLE delay.Setting DROP COLUMN IF EXISTS TargetLockTimeoutMs;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.AllowedProcedure', N'U') IS NOT NULL AND OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') IS NOT NULL
    ALTER TABLE delay.AllowedProcedure DROP COLUMN IF EXISTS DefinitionHash;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Installation', N'U') IS NOT NULL
BEGIN
    DECLARE @Sql NVARCHAR(MAX) = N'';
    SELECT @Sql += CONCAT(N'ENABLE TRIGGER ', SUBSTRING(i.Item, 18, 400), N' ON dbo.tabDIYTable12402; ')
    FROM delay.Installation AS i
    WHERE i.Item LIKE N'disabled trigger %' AND i.Detail = N'0006';
    EXEC sys.sp_executesql @Sql;
    DELETE FROM delay.Installation WHERE Item LIKE N'disabled trigger %' AND Detail = N'0006';
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0006';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Activation INT = CAST(SESSION_CONTEXT(N'mailq_db.activation') AS INT);
IF @Activation IS NOT NULL AND EXISTS (
    SELECT 1 FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') AND q.activation_procedure IS NOT NULL)
BEGIN
    IF @Activation = 1
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON);
    ELSE
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);
END;
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = NULL;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0006 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0005' WHERE dbo.mailq_alembic_version.version_num = '0006';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0005 -> 0004

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0005')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0005; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.FinalizeMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.FinalizeMail FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.FinalizeMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.FinalizeMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.FinalizeMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

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

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
IX_MailQueue_Claim serves mailq.ClaimMail at any queue depth.

Keys (Priority DESC, VisibleAtUtc, ID), filtered to the claimable statuses,
so the index holds only UnSent and Sending rows (a sent backlog of millions
costs it nothing).  ClaimMail's predicate is
    Status IN (N'UnSent', N'Sending')            -- matches the filter
    AND Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
    AND VisibleAtUtc <= @Now
    ORDER BY Priority DESC, VisibleAtUtc, ID
Expected plan: Index Seek on IX_MailQueue_Claim with ten seek ranges
(Priority = p AND VisibleAtUtc <= @Now), read in key order, so the rows come
out already in ORDER BY order: no Sort over the backlog; Top (@BatchSize)
stops the seek after the first rows that pass the residual predicates
(account has budget, application); Key Lookup of the clustered index for the
UPDATE; Clustered Index Update.  Logical reads per claim then depend on the
batch size, not on the depth.  The integration suite checks the actual
showplan at 100 k rows (tests/integration/test_mailq_claim_plan.py).

INCLUDE covers the residual predicates (AccountName, AppName) without a
lookup for rows that are skipped.  ALLOW_PAGE_LOCKS = OFF keeps READPAST at
row grain (a page lock would make READPAST skip a whole page of due mail).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Claim' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailQueue_Claim
    ON mailq.MailQueue (Priority DESC, VisibleAtUtc ASC, ID ASC)
    INCLUDE (AccountName, AppName)
    WHERE Status IN (N'UnSent', N'Sending')
    WITH (ALLOW_PAGE_LOCKS = OFF);
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_Expiry ON mailq.MailQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_Finalize ON mailq.MailQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_ClaimByAccount ON mailq.MailQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0005';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0005 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0004' WHERE dbo.mailq_alembic_version.version_num = '0005';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0004 -> 0003

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0004 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0004')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0004; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0004 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0004 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Activation INT = (
    SELECT CAST(q.is_activation_enabled AS INT) FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ'));
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = @Activation;
IF @Activation = 1
    ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0004 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
dbo.ProcessDelayQueue: activation procedure of dbo.DelayServiceQueue; runs due
delayed tasks.  Service Broker starts it (EXECUTE AS OWNER, up to
MAX_QUEUE_READERS copies); it loops until the queue stays empty for
delay.Setting.ReceiveWaitMs, then returns.
Parameters:  none.  Result sets: none.
Messages:    DialogTimer (on a task's initiator handle): the delay, a retry's
                 backoff or the watchdog lease has expired
             MailqDelayRequest (on the target handle; body = task ID):
                 a task with delay 0, to run at once
             EndDialog, Error: end this side of the conversation; a task still
                 pending on it is failed (BrokerError)
Pattern:     DESIGN.md pattern (a), "receive, record, commit; then run":
             1. one transaction RECEIVEs one message, moves the task to Running,
                counts the attempt, sets the conversation timer to the lease
                (the watchdog) and COMMITs.  Only our own bookkeeping runs in a
                transaction that received a message, so no target can make it
                roll back.  (Service Broker disables a queue after five
                rollbacks in a row of transactions that received from it.)
             2. the target runs in a transaction of its own, through
                sp_executesql with the name built from catalog names
                (QUOTENAME) and every value passed as a parameter.  A target
                that throws or dooms its transaction (XACT_STATE() = -1) is
                rolled back; one that commits or rolls back our transaction
                itself raises 266 at its return (transaction count mismatch)
                and is failed without retry, because its work may already be
                committed; a slow one simply runs (nothing interrupts it).
             3. a new transaction records the outcome: Done (receipt 1, the
                conversation ends), or Retrying (a new conversation timer on the
                same conversation: backoff RetryBaseSeconds * 4^(n-1), capped at
                RetryMaxSeconds), or, after MaxAttempts runs, Failed (receipt 3,
                the conversation ends).
             Watchdog: while a task runs, its runner holds a session-owned
             application lock named for the task.  When the lease timer fires
             and the lock is free, the runner is gone (its session ended
             mid-target): the attempt is failed (RunnerLost) and retried.  When
             the lock is held, the runner is alive and slow: the lease is
             extended and a Slow row is logged.
             Timers longer than one day are chained: a timer never exceeds
             86,400 s; when it fires early the task is re-armed for the rest.
             If our own bookkeeping fails, its transaction is rolled back once
             and the same message is received again in a fresh transaction
             that only records the failure and ends the conversation, so no
             message is ever rolled back twice by this procedure.
Locks:       every transaction here takes the conversation group first (RECEIVE,
             or BEGIN CONVERSATION TIMER in step 3), then the task row, the
             same order as dbo.CancelDelayExecution.  DEADLOCK_PRIORITY HIGH:
             in a deadlock with an application session, the application is
             the victim, not a transaction that received a message.
Errors:      none raised: failures go to delay.Log (docs/errors.md 503xx).
Example:     started by Service Broker; to drain by hand: EXEC dbo.ProcessDelayQueue;
*/
CREATE OR ALTER PROCEDURE dbo.ProcessDelayQueue
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET DEADLOCK_PRIORITY HIGH;

    DECLARE
        @Handle UNIQUEIDENTIFIER,
        @MessageType SYSNAME,
        @Body VARBINARY(MAX),
        @Now DATETIME2(3),
        @TaskID BIGINT,
        @TaskHandle UNIQUEIDENTIFIER,
        @TaskState NVARCHAR(16),
        @TargetName NVARCHAR(400),
        @NextRunAtUtc DATETIME2(3),
        @LeaseUntilUtc DATETIME2(3),
        @Attempts INT,
        @Attempt INT,
        @RemainingMs BIGINT,
        @Timeout INT,
        @Refusal INT,
        @RefusalMessage NVARCHAR(400),
        @SchemaName SYSNAME,
        @ProcedureName SYSNAME,
        @SPName NVARCHAR(200),
        @Param1 NVARCHAR(200),
        @Param2 NVARCHAR(200),
        @Param3 NVARCHAR(200),
        @Param4 NVARCHAR(200),
        @Param5 NVARCHAR(200),
        @Run BIT,
        @Retryable BIT,
        @Sql NVARCHAR(MAX),
        -- The target contract: (@SPName, @Param1 ... @Param5 NVARCHAR(200)).
        @ParameterList NVARCHAR(400) = CONCAT(
            N'@SPName NVARCHAR(200), @Param1 NVARCHAR(200), @Param2 NVARCHAR(200), ',
            N'@Param3 NVARCHAR(200), @Param4 NVARCHAR(200), @Param5 NVARCHAR(200)'
        ),
        @LockName NVARCHAR(255),
        @LockResult INT,
        @ErrorNumber INT,
        @ErrorMessage NVARCHAR(4000),
        @ErrorXml XML,
        @StepErrorNumber INT,
        @StepErrorMessage NVARCHAR(4000),
        @Backoff BIGINT,
        @Recorded BIT,
        @Try INT,
        @MaxAttempts INT,
        @RetryBaseSeconds INT,
        @RetryMaxSeconds INT,
        @LeaseSeconds INT,
        @ReceiveWaitMs INT;

    DECLARE
        @DialogTimer SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer',
        @EndDialog SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog',
        @BrokerError SYSNAME = N'http://schemas.microsoft.com/SQL/ServiceBroker/Error',
        @DelayRequest SYSNAME = N'MailqDelayRequest',
        -- A conversation timer never exceeds one day; longer delays are chained.
        @MaxTimerSeconds INT = 86400,
        -- A timer that fires less than this before the due time counts as due
        -- (timers have whole-second resolution).
        @EarlyToleranceMs INT = 500;

    WHILE 1 = 1
    BEGIN
        SELECT
            @Handle = NULL,
            @MessageType = NULL,
            @Body = NULL,
            @TaskID = NULL,
            @TaskHandle = NULL,
            @TaskState = NULL,
            @Run = 0,
            @MaxAttempts = 3,
            @RetryBaseSeconds = 30,
            @RetryMaxSeconds = 3600,
            @LeaseSeconds = 600,
            @ReceiveWaitMs = 5000;

        SELECT
            @MaxAttempts = s.MaxAttempts,
            @RetryBaseSeconds = s.RetryBaseSeconds,
            @RetryMaxSeconds = s.RetryMaxSeconds,
            @LeaseSeconds = s.LeaseSeconds,
            @ReceiveWaitMs = s.ReceiveWaitMs
        FROM delay.Setting AS s
        WHERE s.SettingId = 1;

        ------------------------------------------------------------------
        -- 1. Receive one message and do the bookkeeping; commit.
        ------------------------------------------------------------------
        BEGIN TRY
            BEGIN TRANSACTION;

            -- WAITFOR (RECEIVE ...), TIMEOUT: waits up to @ReceiveWaitMs
            -- milliseconds for a message; no message means the reader exits.
            -- RECEIVE locks the message's conversation group until COMMIT.
            WAITFOR (
                RECEIVE TOP (1)
                    @Handle = conversation_handle,
                    @MessageType = message_type_name,
                    @Body = message_body
                FROM dbo.DelayServiceQueue
            ), TIMEOUT @ReceiveWaitMs;

            IF @Handle IS NULL
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            SET @Now = SYSUTCDATETIME();

            IF @MessageType = @DelayRequest
                SET @TaskID = CAST(@Body AS BIGINT);
            ELSE
                SELECT @TaskID = t.TaskID
                FROM delay.Task AS t
                WHERE t.ConversationHandle = @Handle;

            -- UPDLOCK: hold the row for this state transition, so a cancel or
            -- another reader cannot move the task between our read and write.
            -- ROWLOCK: one task, one row lock.
            SELECT
                @TaskState = t.TaskState,
                @TaskHandle = t.ConversationHandle,
                @TargetName = t.TargetName,
                @NextRunAtUtc = t.NextRunAtUtc,
                @LeaseUntilUtc = t.LeaseUntilUtc,
                @Attempts = t.Attempts
            FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
            WHERE t.TaskID = @TaskID;

            IF @MessageType IN (@EndDialog, @BrokerError)
            BEGIN
                IF @MessageType = @BrokerError
                BEGIN
                    -- The body of an Error message is
                    -- <Error xmlns="http://schemas.microsoft.com/SQL/ServiceBroker/Error">
                    --   <Code>n</Code><Description>text</Description></Error>
                    -- (*: matches that namespace without declaring it.)
                    SET @ErrorXml = CAST(@Body AS XML);
                    SELECT
                        @ErrorNumber = @ErrorXml.value('(/*:Error/*:Code)[1]', 'INT'),
                        @ErrorMessage = @ErrorXml.value('(/*:Error/*:Description)[1]', 'NVARCHAR(4000)');
                END;
                ELSE
                    SELECT
                        @ErrorNumber = 50333,
                        @ErrorMessage = N'the conversation was ended by its other side before the task finished';

                IF @TaskState IN (N'Scheduled', N'Running', N'Retrying') AND @TaskHandle = @Handle
                    -- Ends @Handle, the task's own conversation.
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'BrokerError',
                        @ErrorNumber = @ErrorNumber,
                        @ErrorMessage = @ErrorMessage;
                ELSE
                    -- The target side of a delay-0 dialog, or a conversation
                    -- whose task is already final: just end this side.
                    END CONVERSATION @Handle;
            END;
            ELSE IF @MessageType NOT IN (@DialogTimer, @DelayRequest)
                -- Not ours (nothing else is in the contract): drop the conversation.
                END CONVERSATION @Handle;
            ELSE IF @TaskState IS NULL
                -- No task (it was replaced or never recorded): nothing to run.
                END CONVERSATION @Handle;
            ELSE IF @TaskState IN (N'Done', N'Failed', N'Refused', N'Cancelled')
            BEGIN
                -- Final already.  A late timer ends its conversation; a late
                -- DelayRequest leaves the target side to the EndDialog that
                -- the initiator side's END CONVERSATION sent.
                IF @MessageType = @DialogTimer
                    END CONVERSATION @Handle;
            END;
            ELSE IF @MessageType = @DelayRequest AND @TaskState <> N'Scheduled'
                -- A run already started through the task's own conversation.
                SET @Run = 0;
            ELSE IF @MessageType = @DialogTimer AND @TaskState = N'Running'
            BEGIN
                SET @RemainingMs = DATEDIFF_BIG(MILLISECOND, @Now, @LeaseUntilUtc);
                IF @RemainingMs > @EarlyToleranceMs
                BEGIN
                    -- Early (chained or re-armed timer): wait for the rest of the lease.
                    SET @Timeout = CASE
                        WHEN @RemainingMs >= CAST(@MaxTimerSeconds AS BIGINT) * 1000 THEN @MaxTimerSeconds
                        ELSE CAST((@RemainingMs + 999) / 1000 AS INT)
                    END;
                    BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
                END;
                ELSE
                BEGIN
                    -- The lease expired: is the runner alive?  It holds this
                    -- session-owned lock for as long as the target runs; a
                    -- session that ended released it.
                    SET @LockName = CONCAT(N'mailq-db/delay/task/', @TaskID);
                    EXEC @LockResult = sys.sp_getapplock
                        @Resource = @LockName,
                        @LockMode = N'Exclusive',
                        @LockOwner = N'Session',
                        @LockTimeout = 0;

                    IF @LockResult < 0
                    BEGIN
                        -- Alive and slow: extend the lease, never interrupt.
                        UPDATE delay.Task
                        SET LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now)
                        WHERE TaskID = @TaskID;

                        SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                        BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;

                        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorMessage, ConversationHandle)
                        VALUES (
                            @TaskID, N'Slow', @TargetName, @Attempts,
                            CONCAT(N'attempt ', @Attempts, N' still running after its lease; lease extended by ',
                                @LeaseSeconds, N' s'),
                            @Handle
                        );
                    END;
                    ELSE
                    BEGIN
                        EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';

                        SET @ErrorMessage = CONCAT(
                            N'attempt ', @Attempts, N' ended without reporting: its session ended while the target ran'
                        );
                        IF @Attempts < @MaxAttempts
                        BEGIN
                            SET @Backoff = CAST(@RetryBaseSeconds AS BIGINT)
                                * POWER(CAST(4 AS BIGINT), IIF(@Attempts > 10, 10, @Attempts - 1));
                            SET @Timeout = CAST(IIF(@Backoff > @RetryMaxSeconds, @RetryMaxSeconds, @Backoff) AS INT);

                            UPDATE delay.Task
                            SET
                                TaskState = N'Retrying',
                                NextRunAtUtc = DATEADD(SECOND, @Timeout, @Now),
                                LeaseUntilUtc = NULL,
                                LastErrorNumber = 50331,
                                LastErrorMessage = @ErrorMessage
                            WHERE TaskID = @TaskID;

                            BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;

                            INSERT INTO delay.Log (
                                TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                            )
                            VALUES (@TaskID, N'RunnerLost', @TargetName, @Attempts, 50331, @ErrorMessage, @Handle);
                        END;
                        ELSE
                            EXEC delay.FinishTask
                                @TaskID = @TaskID,
                                @TaskState = N'Failed',
                                @EventName = N'RunnerLost',
                                @ErrorNumber = 50331,
                                @ErrorMessage = @ErrorMessage;
                    END;
                END;
            END;
            ELSE
            BEGIN
                -- Scheduled or Retrying, on its timer or its DelayRequest.
                SET @RemainingMs = DATEDIFF_BIG(MILLISECOND, @Now, @NextRunAtUtc);
                IF @MessageType = @DialogTimer AND @RemainingMs > @EarlyToleranceMs
                BEGIN
                    -- A chained timer of a delay longer than one day: re-arm for the rest.
                    SET @Timeout = CASE
                        WHEN @RemainingMs >= CAST(@MaxTimerSeconds AS BIGINT) * 1000 THEN @MaxTimerSeconds
                        ELSE CAST((@RemainingMs + 999) / 1000 AS INT)
                    END;
                    BEGIN CONVERSATION TIMER (@Handle) TIMEOUT = @Timeout;
                END;
                ELSE
                BEGIN
                    -- Due.  Resolve the name again: the allow-list or the
                    -- procedure may have changed since the row was scheduled.
                    SELECT
                        @Refusal = r.RefusalNumber,
                        @RefusalMessage = r.RefusalMessage,
                        @SchemaName = r.SchemaName,
                        @ProcedureName = r.ProcedureName
                    FROM delay.ResolveTarget(@TargetName) AS r;

                    IF @Refusal IS NOT NULL
                        EXEC delay.FinishTask
                            @TaskID = @TaskID,
                            @TaskState = N'Refused',
                            @EventName = N'Refused',
                            @ErrorNumber = @Refusal,
                            @ErrorMessage = @RefusalMessage;
                    ELSE
                    BEGIN
                        -- The values are read at run time, by the row's ID.
                        SELECT
                            @SPName = CAST(p.F108211 AS NVARCHAR(200)),
                            @Param1 = CAST(p.F108212 AS NVARCHAR(200)),
                            @Param2 = CAST(p.F108213 AS NVARCHAR(200)),
                            @Param3 = CAST(p.F108214 AS NVARCHAR(200)),
                            @Param4 = CAST(p.F108215 AS NVARCHAR(200)),
                            @Param5 = CAST(p.F108216 AS NVARCHAR(200))
                        FROM dbo.tabDIYTable12402 AS p
                        WHERE p.ID = @TaskID;

                        IF @@ROWCOUNT = 0
                            EXEC delay.FinishTask
                                @TaskID = @TaskID,
                                @TaskState = N'Cancelled',
                                @EventName = N'Cancelled',
                                @ErrorNumber = 50332,
                                @ErrorMessage = N'the platform row was deleted before the task ran';
                        ELSE
                        BEGIN
                            SET @Attempt = @Attempts + 1;

                            UPDATE delay.Task
                            SET
                                TaskState = N'Running',
                                Attempts = @Attempt,
                                SchemaName = @SchemaName,
                                ProcedureName = @ProcedureName,
                                FirstStartedAtUtc = ISNULL(FirstStartedAtUtc, @Now),
                                LastStartedAtUtc = @Now,
                                NextRunAtUtc = NULL,
                                LeaseUntilUtc = DATEADD(SECOND, @LeaseSeconds, @Now)
                            WHERE TaskID = @TaskID;

                            -- The watchdog: on the task's own conversation
                            -- (for a DelayRequest, @Handle is the target side).
                            SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                            BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                            SET @Run = 1;
                        END;
                    END;
                END;
            END;

            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            SELECT @ErrorNumber = ERROR_NUMBER(), @ErrorMessage = ERROR_MESSAGE();
            -- The message goes back to the queue: one rollback of it.
            IF XACT_STATE() <> 0
                ROLLBACK TRANSACTION;

            -- Nothing received (the queue itself failed, e.g. disabled): stop;
            -- activation starts a reader again when the queue works.
            IF @Handle IS NULL
                RETURN;

            -- Receive that message again in a fresh transaction that only
            -- records the failure and ends the conversation, so it is never
            -- rolled back a second time in a row by a retry of the same bug.
            BEGIN TRY
                BEGIN TRANSACTION;

                RECEIVE TOP (1) @Body = message_body
                FROM dbo.DelayServiceQueue
                WHERE conversation_handle = @Handle;

                SET @ErrorMessage = CONCAT(
                    N'dbo.ProcessDelayQueue failed on a ', @MessageType, N' message: ', @ErrorMessage
                );

                IF @TaskID IS NOT NULL AND EXISTS (
                    SELECT 1 FROM delay.Task AS t
                    WHERE t.TaskID = @TaskID AND t.TaskState IN (N'Scheduled', N'Running', N'Retrying')
                )
                BEGIN
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'BrokerError',
                        @ErrorNumber = @ErrorNumber,
                        @ErrorMessage = @ErrorMessage;
                    -- For a DelayRequest, @Handle is the target side; it ends
                    -- when the EndDialog that FinishTask caused arrives.
                END;
                ELSE
                BEGIN
                    INSERT INTO delay.Log (TaskID, EventName, ErrorNumber, ErrorMessage, ConversationHandle)
                    VALUES (@TaskID, N'BrokerError', @ErrorNumber, @ErrorMessage, @Handle);
                    END CONVERSATION @Handle;
                END;

                COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- Twice in a row: stop this reader rather than spin.  The
                -- message stays on the queue for a later reader.
                RETURN;
            END CATCH;

            SET @Run = 0;
        END CATCH;

        IF @Run = 0
            CONTINUE;

        ------------------------------------------------------------------
        -- 2. Run the target in its own transaction.
        ------------------------------------------------------------------
        SET @LockName = CONCAT(N'mailq-db/delay/task/', @TaskID);
        -- Session-owned: survives the target's COMMIT or ROLLBACK; released
        -- below, or by the end of this session if it dies mid-target.
        EXEC @LockResult = sys.sp_getapplock
            @Resource = @LockName,
            @LockMode = N'Exclusive',
            @LockOwner = N'Session',
            @LockTimeout = 0;

        SELECT @ErrorNumber = NULL, @ErrorMessage = NULL, @Retryable = 1;

        IF @LockResult < 0
            -- Another session holds this task: never run it twice at once.
            SELECT
                @ErrorNumber = 50334,
                @ErrorMessage = N'another session held the task''s run lock; this attempt did not run the target',
                @Retryable = 1;
        ELSE
        BEGIN
            -- Built from the catalog's names (delay.ResolveTarget checked the
            -- allow-list and the object's identity), each part QUOTENAMEd;
            -- the six values are parameters, never part of the text.
            SET @Sql = CONCAT(
                N'EXEC ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@ProcedureName),
                N' @SPName = @SPName, @Param1 = @Param1, @Param2 = @Param2,',
                N' @Param3 = @Param3, @Param4 = @Param4, @Param5 = @Param5;'
            );

            BEGIN TRY
                BEGIN TRANSACTION;

                EXEC sys.sp_executesql
                    @Sql,
                    @ParameterList,
                    @SPName = @SPName,
                    @Param1 = @Param1,
                    @Param2 = @Param2,
                    @Param3 = @Param3,
                    @Param4 = @Param4,
                    @Param5 = @Param5;

                IF @@TRANCOUNT > 1
                BEGIN
                    -- Left a transaction of its own open (normally 266 is raised first).
                    SELECT
                        @ErrorNumber = 50335,
                        @ErrorMessage = CONCAT(N'the target left ', @@TRANCOUNT - 1, N' transaction(s) open');
                    ROLLBACK TRANSACTION;
                END;
                ELSE IF @@TRANCOUNT = 1
                    COMMIT TRANSACTION;
            END TRY
            BEGIN CATCH
                SELECT @ErrorNumber = ERROR_NUMBER(), @ErrorMessage = ERROR_MESSAGE();
                -- Doomed (-1) or not (1): the target's work is undone as a whole.
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- 266: the target committed or rolled back the transaction
                -- opened for it; what it did may be committed, so it is not
                -- run again.
                IF @ErrorNumber = 266
                    SELECT
                        @Retryable = 0,
                        @ErrorMessage = CONCAT(
                            N'the target committed or rolled back the transaction opened for it ',
                            N'(its work may be committed; not retried): ', @ErrorMessage
                        );
            END CATCH;
        END;

        ------------------------------------------------------------------
        -- 3. Record the outcome in a new transaction (retried on deadlock).
        ------------------------------------------------------------------
        SELECT @Recorded = 0, @Try = 0;
        WHILE @Recorded = 0 AND @Try < 3
        BEGIN
            SET @Try += 1;
            BEGIN TRY
                BEGIN TRANSACTION;

                -- Conversation group first (BEGIN CONVERSATION TIMER locks it),
                -- then the task row: the lock order of step 1.  It also keeps
                -- the watchdog armed until the outcome is committed.
                SET @Timeout = IIF(@LeaseSeconds > @MaxTimerSeconds, @MaxTimerSeconds, @LeaseSeconds);
                BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                SET @TaskState = NULL;
                -- UPDLOCK, ROWLOCK: as in step 1.
                SELECT
                    @TaskState = t.TaskState,
                    @Attempts = t.Attempts
                FROM delay.Task AS t WITH (UPDLOCK, ROWLOCK)
                WHERE t.TaskID = @TaskID;

                SET @Now = SYSUTCDATETIME();

                IF @TaskState IS NULL OR @TaskState <> N'Running' OR @Attempts <> @Attempt
                BEGIN
                    -- Finished meanwhile (a broker Error) or the row is gone: keep that outcome.
                    IF @ErrorNumber IS NOT NULL
                        INSERT INTO delay.Log (
                            TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                        )
                        VALUES (@TaskID, N'Failed', @TargetName, @Attempt, @ErrorNumber, @ErrorMessage, @TaskHandle);
                END;
                ELSE IF @ErrorNumber IS NULL
                    EXEC delay.FinishTask @TaskID = @TaskID, @TaskState = N'Done';
                ELSE IF @Retryable = 1 AND @Attempt < @MaxAttempts
                BEGIN
                    SET @Backoff = CAST(@RetryBaseSeconds AS BIGINT)
                        * POWER(CAST(4 AS BIGINT), IIF(@Attempt > 10, 10, @Attempt - 1));
                    SET @Timeout = CAST(IIF(@Backoff > @RetryMaxSeconds, @RetryMaxSeconds, @Backoff) AS INT);

                    UPDATE delay.Task
                    SET
                        TaskState = N'Retrying',
                        NextRunAtUtc = DATEADD(SECOND, @Timeout, @Now),
                        LeaseUntilUtc = NULL,
                        LastErrorNumber = @ErrorNumber,
                        LastErrorMessage = @ErrorMessage
                    WHERE TaskID = @TaskID;

                    -- Replaces the lease: the retry is a new timer on the same conversation.
                    BEGIN CONVERSATION TIMER (@TaskHandle) TIMEOUT = @Timeout;

                    INSERT INTO delay.Log (
                        TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle
                    )
                    VALUES (@TaskID, N'Failed', @TargetName, @Attempt, @ErrorNumber, @ErrorMessage, @TaskHandle);
                END;
                ELSE
                    EXEC delay.FinishTask
                        @TaskID = @TaskID,
                        @TaskState = N'Failed',
                        @EventName = N'GaveUp',
                        @ErrorNumber = @ErrorNumber,
                        @ErrorMessage = @ErrorMessage;

                COMMIT TRANSACTION;
                SET @Recorded = 1;
            END TRY
            BEGIN CATCH
                SELECT @StepErrorNumber = ERROR_NUMBER(), @StepErrorMessage = ERROR_MESSAGE();
                IF XACT_STATE() <> 0
                    ROLLBACK TRANSACTION;
                -- 1205: deadlock victim, try again.  Anything else (e.g. the
                -- conversation was ended by a broker Error meanwhile): stop
                -- trying; the task's state already says what happened, or the
                -- lease timer will find it Running with no runner.
                IF @StepErrorNumber <> 1205 OR @Try >= 3
                BEGIN
                    SET @Try = 3;
                    BEGIN TRY
                        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage)
                        VALUES (
                            @TaskID, N'BrokerError', @TargetName, @Attempt, @StepErrorNumber,
                            CONCAT(N'the outcome of attempt ', @Attempt, N' could not be recorded: ', @StepErrorMessage)
                        );
                    END TRY
                    BEGIN CATCH
                        -- Best effort: the lease timer still covers the task.
                        SET @Recorded = 0;
                    END CATCH;
                END;
            END CATCH;
        END;

        IF @LockResult >= 0
            EXEC sys.sp_releaseapplock @Resource = @LockName, @LockOwner = N'Session';
    END;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0004 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0004';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0004 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Activation INT = CAST(SESSION_CONTEXT(N'mailq_db.activation') AS INT);
IF @Activation IS NOT NULL AND EXISTS (
    SELECT 1 FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') AND q.activation_procedure IS NOT NULL)
BEGIN
    IF @Activation = 1
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON);
    ELSE
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);
END;
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = NULL;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0004 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0003' WHERE dbo.mailq_alembic_version.version_num = '0004';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0003 -> 0002

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0003')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0003; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.UpsertSendingAccount: creates a sending account or changes its
settings (and creates its rate budget row).  SMTP host and credentials are
not stored: the worker's configuration maps the account name to them.
Parameters:  @AccountName NVARCHAR(128), required
             @DefaultFromAddress NVARCHAR(320), required: one address
             @DefaultFromName NVARCHAR(200), optional
             @PerMinuteLimit, @PerHourLimit, @PerDayLimit INT > 0, NULL = unlimited
             @IsDefault BIT, default 0: 1 makes this the account EnqueueMail
                        uses when @AccountName is NULL (the previous default is cleared)
Result set:  none.
Errors:      50142 @AccountName missing; 50103 a value over its size;
             50102 @DefaultFromAddress invalid; 50143 a limit not positive.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.UpsertSendingAccount @AccountName = N'qq',
                 @DefaultFromAddress = N'noreply@example.com', @PerMinuteLimit = 20,
                 @PerHourLimit = 500, @PerDayLimit = 5000, @IsDefault = 1;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertSendingAccount
    @AccountName NVARCHAR(4000),
    @DefaultFromAddress NVARCHAR(4000),
    @DefaultFromName NVARCHAR(4000) = NULL,
    @PerMinuteLimit INT = NULL,
    @PerHourLimit INT = NULL,
    @PerDayLimit INT = NULL,
    @IsDefault BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    SET @IsDefault = COALESCE(@IsDefault, 0);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;
    IF LEN(@AccountName) > 128 OR LEN(@DefaultFromAddress) > 320 OR LEN(@DefaultFromName) > 200
        THROW 50103, N'@AccountName (128), @DefaultFromAddress (320) or @DefaultFromName (200) is over its size.', 1;
    IF @DefaultFromName LIKE N'%[' + NCHAR(13) + NCHAR(10) + N']%'
        THROW 50105, N'@DefaultFromName contains CR or LF (header injection is refused).', 1;
    IF
        @DefaultFromAddress IS NULL
        OR (SELECT COUNT(*) FROM mailq.ParseAddressList(@DefaultFromAddress)) <> 1
        OR EXISTS (SELECT 1 FROM mailq.ParseAddressList(@DefaultFromAddress) AS a WHERE a.Problem IS NOT NULL)
    BEGIN
        SET @Msg = CONCAT(
            N'@DefaultFromAddress must be one valid address; got ''', LEFT(@DefaultFromAddress, 100), N'''.'
        );
        THROW 50102, @Msg, 1;
    END;
    IF @PerMinuteLimit <= 0 OR @PerHourLimit <= 0 OR @PerDayLimit <= 0
        THROW 50143, N'@PerMinuteLimit, @PerHourLimit and @PerDayLimit must be positive, or NULL for no limit.', 1;

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION UpsertSendingAccount;

        IF @IsDefault = 1
            UPDATE a
            SET a.IsDefault = 0
            FROM mailq.SendingAccount AS a
            WHERE a.IsDefault = 1 AND a.AccountName <> @AccountName;

        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race between two callers.
        IF EXISTS (
            SELECT 1
            FROM mailq.SendingAccount AS a WITH (UPDLOCK, HOLDLOCK)
            WHERE a.AccountName = @AccountName
        )
            UPDATE a
            SET
                a.DefaultFromAddress = LTRIM(RTRIM(@DefaultFromAddress)),
                a.DefaultFromName = @DefaultFromName,
                a.PerMinuteLimit = @PerMinuteLimit,
                a.PerHourLimit = @PerHourLimit,
                a.PerDayLimit = @PerDayLimit,
                a.IsDefault = @IsDefault
            FROM mailq.SendingAccount AS a
            WHERE a.AccountName = @AccountName;
        ELSE
            INSERT INTO mailq.SendingAccount (
                AccountName, DefaultFromAddress, DefaultFromName,
                PerMinuteLimit, PerHourLimit, PerDayLimit, IsDefault
            )
            VALUES (
                @AccountName, LTRIM(RTRIM(@DefaultFromAddress)), @DefaultFromName,
                @PerMinuteLimit, @PerHourLimit, @PerDayLimit, @IsDefault
            );

        IF NOT EXISTS (SELECT 1 FROM mailq.RateBudget AS b WHERE b.AccountName = @AccountName)
            INSERT INTO mailq.RateBudget (AccountName) VALUES (@AccountName);

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION UpsertSendingAccount;
        THROW;
    END CATCH;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.MarkFailed: records a failed attempt; fenced by the lock token, all or
nothing.  @Disposition follows TinyMail's error classes:
  Retry  transient (4xx on the mail, dropped connection, timeout): the attempt
         is consumed; the mail is UnSent again after @RetryAfterSeconds, or
         after exponential backoff with jitter: 30 s * 2^(attempt-1), at most
         1 hour, times a random 0.8-1.2; Failed when no attempt is left.
  Wait   the account is throttled or locked (421, rate limits): the attempt is
         refunded, the mail is UnSent again after @RetryAfterSeconds (default
         60), and the account is blocked until then (ClaimMail skips it).
  Stop   permanent (5xx, malformed mail): Failed at once.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required; @Disposition NVARCHAR(8),
             required; @Error NVARCHAR(4000), required: what happened;
             @RetryAfterSeconds INT 0-604800, optional; @SmtpCode INT 200-599, optional.
Result set:  one row per mail: ID, Status (UnSent or Failed), NextAttemptUtc
             (NULL when Failed).
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail);
             50133 @Disposition unknown; 50134 @RetryAfterSeconds out of range;
             50139 @Error missing; 50147 @SmtpCode out of range.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.MarkFailed @ID = 101, @LockToken = @T, @Disposition = N'Retry',
                 @Error = N'451 4.3.0 try again later', @SmtpCode = 451;
*/
CREATE OR ALTER PROCEDURE mailq.MarkFailed
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @Disposition NVARCHAR(20),
    @Error NVARCHAR(4000),
    @RetryAfterSeconds INT = NULL,
    @SmtpCode INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @Disposition IS NULL OR @Disposition NOT IN (N'Retry', N'Wait', N'Stop')
    BEGIN
        SET @Msg = CONCAT(N'@Disposition must be Retry, Wait or Stop; got ''', @Disposition, N'''.');
        THROW 50133, @Msg, 1;
    END;
    IF NULLIF(LTRIM(RTRIM(@Error)), N'') IS NULL
        THROW 50139, N'@Error is required: say what failed (the SMTP reply or the exception).', 1;
    IF @RetryAfterSeconds NOT BETWEEN 0 AND 604800
    BEGIN
        SET @Msg = CONCAT(N'@RetryAfterSeconds must be 0-604800 (7 days); got ', @RetryAfterSeconds, N'.');
        THROW 50134, @Msg, 1;
    END;
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @WaitUntil DATETIME2(3) = DATEADD(SECOND, COALESCE(@RetryAfterSeconds, 60), @Now);
    DECLARE @Acked TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AttemptNo INT NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        Status NVARCHAR(16) NOT NULL,
        NextAttemptUtc DATETIME2(3) NULL
    );

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION MarkFailed;

        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;

        WITH Outcome AS (
            SELECT
                q.ID,
                q.AccountName,
                q.Status,
                q.ThreadLock,
                q.VisibleAtUtc,
                q.AttemptsRemaining,
                q.AttemptCount,
                q.DateProcessed,
                q.LastError,
                CASE
                    WHEN @Disposition = N'Wait' THEN N'UnSent'
                    WHEN @Disposition = N'Retry' AND q.AttemptsRemaining > 0 THEN N'UnSent'
                    ELSE N'Failed'
                END AS NewStatus,
                CASE
                    WHEN @Disposition = N'Wait' THEN @WaitUntil
                    WHEN @RetryAfterSeconds IS NOT NULL THEN DATEADD(SECOND, @RetryAfterSeconds, @Now)
                    -- Exponential backoff with jitter; NEWID() gives each row its own.
                    ELSE DATEADD(
                        MILLISECOND,
                        CAST(
                            IIF(
                                q.AttemptCount >= 8, 3600,
                                30 * POWER(2, IIF(q.AttemptCount < 1, 0, q.AttemptCount - 1))
                            )
                            * (800 + ABS(CHECKSUM(NEWID())) % 401) AS INT
                        ),
                        @Now
                    )
                END AS RetryAtUtc
            FROM mailq.MailQueue AS q
            INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
            WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken
        )

        UPDATE o
        SET
            o.Status = o.NewStatus,
            o.ThreadLock = NULL,
            o.VisibleAtUtc = IIF(o.NewStatus = N'UnSent', o.RetryAtUtc, o.VisibleAtUtc),
            -- Wait is not the mail's fault: its attempt is refunded.
            o.AttemptsRemaining = o.AttemptsRemaining + IIF(@Disposition = N'Wait', 1, 0),
            o.DateProcessed = @Now,
            o.LastError = @Error
        OUTPUT
            inserted.ID,
            inserted.AttemptCount,
            inserted.AccountName,
            inserted.Status,
            IIF(inserted.Status = N'UnSent', inserted.VisibleAtUtc, NULL)
        INTO @Acked (ID, AttemptNo, AccountName, Status, NextAttemptUtc)
        FROM Outcome AS o;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = @Disposition,
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @Error
        FROM mailq.MailAttempt AS t
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;

        IF @Disposition = N'Wait'
            UPDATE s
            SET
                s.BlockedUntilUtc = IIF(s.BlockedUntilUtc > @WaitUntil, s.BlockedUntilUtc, @WaitUntil),
                s.BlockReason = @Error
            FROM mailq.SendingAccount AS s
            WHERE s.AccountName IN (SELECT a.AccountName FROM @Acked AS a);

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION MarkFailed;
        THROW;
    END CATCH;

    SELECT
        a.ID,
        a.Status,
        a.NextAttemptUtc
    FROM @Acked AS a
    ORDER BY a.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.MarkSent: records mails as sent; fenced by the lock token and all or
nothing, so one call acknowledges every mail sent on one SMTP connection.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array of 1-1000 IDs):
             exactly one; @LockToken UNIQUEIDENTIFIER, required;
             @SmtpCode INT 200-599 and @SmtpText NVARCHAR(4000): the server's
             final reply, optional; @DryRun BIT, default 0: 1 records that
             nothing was sent (worker dry-run mode).
Result set:  one row per mail: ID, Status ('Sent'), NextAttemptUtc (NULL).
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail);
             50147 @SmtpCode out of range.  On any error nothing is written.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.MarkSent @IDList = N'[101,102]', @LockToken = @T, @SmtpCode = 250;
*/
CREATE OR ALTER PROCEDURE mailq.MarkSent
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @SmtpCode INT = NULL,
    @SmtpText NVARCHAR(4000) = NULL,
    @DryRun BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    SET @DryRun = COALESCE(@DryRun, 0);
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Acked TABLE (ID BIGINT NOT NULL PRIMARY KEY, AttemptNo INT NOT NULL);

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION MarkSent;

        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;

        UPDATE q
        SET
            q.Status = N'Sent',
            q.ThreadLock = NULL,
            q.SentAtUtc = @Now,
            q.DateProcessed = @Now,
            q.DryRun = @DryRun,
            q.LastError = NULL
        OUTPUT inserted.ID, inserted.AttemptCount INTO @Acked (ID, AttemptNo)
        FROM mailq.MailQueue AS q
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = IIF(@DryRun = 1, N'DryRun', N'Sent'),
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @SmtpText
        FROM mailq.MailAttempt AS t
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION MarkSent;
        THROW;
    END CATCH;

    SELECT
        a.ID,
        N'Sent' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc
    FROM @Acked AS a
    ORDER BY a.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.ReleaseMail: gives back mails a worker holds but has not sent (e.g. on
shutdown): UnSent and due now, the attempt refunded, the attempt row closed
as Released.  Fenced by the lock token, all or nothing.  The rate budget the
claim took is not refunded (limits stay conservative).
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required.
Result set:  one row per mail: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail).
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.ReleaseMail @IDList = N'[103,104]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.ReleaseMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Released TABLE (ID BIGINT NOT NULL PRIMARY KEY, AttemptNo INT NOT NULL);

    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION ReleaseMail;

        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;

        UPDATE q
        SET
            q.Status = N'UnSent',
            q.ThreadLock = NULL,
            q.VisibleAtUtc = @Now,
            q.AttemptsRemaining = q.AttemptsRemaining + 1
        OUTPUT inserted.ID, inserted.AttemptCount INTO @Released (ID, AttemptNo)
        FROM mailq.MailQueue AS q
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;

        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Released'
        FROM mailq.MailAttempt AS t
        INNER JOIN @Released AS r ON t.MailID = r.ID AND t.AttemptNo = r.AttemptNo;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION ReleaseMail;
        THROW;
    END CATCH;

    SELECT
        r.ID,
        N'UnSent' AS Status,
        @Now AS NextAttemptUtc
    FROM @Released AS r
    ORDER BY r.ID;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

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
BlockedUntilUtc is in the future are skipped.
Parameters:  @BatchSize    INT 1-1000, default 10
             @LockToken    UNIQUEIDENTIFIER, required: the worker's token for
                           this batch; every acknowledgement must present it
             @LeaseSeconds INT 1-3600, default 300
             @AppName      NULL (default): claim every application's mail
                           (competing); a name: only that application's mail (isolated)
             @WorkerName   NVARCHAR(128), recorded in mailq.MailAttempt
Result sets: 1. one row per claimed mail: ID, MessageID, AccountName, AppName,
                FromName, FromAddress, ReplyTo, ToAddress, CC, BCC, Subject,
                Body, BodyFormat, TextBody, Headers, Priority, AttemptNo,
                AttemptsRemaining, LeaseExpiresUtc, PossibleDuplicate, dtStamp
             2. their attachments: MailID, AttachmentNo, FileName, ContentType, Content
Errors:      50130 @BatchSize out of range; 50131 @LockToken missing;
             50132 @LeaseSeconds out of range; 50103 a name over its size;
             50115 unknown @AppName.
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
    @WorkerName NVARCHAR(4000) = NULL
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
            AND (a.BlockedUntilUtc IS NULL OR a.BlockedUntilUtc <= @Now);

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
            AND (a.BlockedUntilUtc IS NULL OR a.BlockedUntilUtc <= @Now);

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
        UPDATE b
        SET
            b.MinuteCount = IIF(b.MinuteStartUtc = @MinuteStart, b.MinuteCount, 0) + c.ClaimedCount,
            b.MinuteStartUtc = @MinuteStart,
            b.HourCount = IIF(b.HourStartUtc = @HourStart, b.HourCount, 0) + c.ClaimedCount,
            b.HourStartUtc = @HourStart,
            b.DayCount = IIF(b.DayStartUtc = @DayStart, b.DayCount, 0) + c.ClaimedCount,
            b.DayStartUtc = @DayStart
        FROM mailq.RateBudget AS b
        INNER JOIN (
            SELECT m.AccountName, COUNT(*) AS ClaimedCount
            FROM @Claimed AS m
            WHERE m.NewStatus = N'Sending'
            GROUP BY m.AccountName
        ) AS c ON b.AccountName = c.AccountName
        WHERE b.AccountName IN (SELECT l.AccountName FROM @Budget AS l WHERE l.IsLimited = 1);

        -- Close the attempts of reclaimed leases as abandoned.
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Abandoned',
            t.ErrorText = N'Lease expired before the worker acknowledged; reclaimed.'
        FROM mailq.MailAttempt AS t
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

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.EnqueueMail: validates one mail and queues it; with an idempotency key
that is already queued it returns the existing mail and inserts nothing.
Parameters:  @ToAddress   NVARCHAR(MAX), required: ';'-separated addresses
             @Subject     NVARCHAR(MAX), required (N'' for none), <= 900 chars
             @Body        NVARCHAR(MAX), required, <= 2,000,000 chars
             @BodyFormat  N'Text' (default) or N'Html'
             @TextBody    plain-text alternative of an Html body, <= 2,000,000 chars
             @CC, @BCC    ';'-separated addresses; BCC is never sent as a header
             @FromAddress default: the account's DefaultFromAddress
             @FromName    default: the account's DefaultFromName, <= 200 chars
             @ReplyTo     one address
             @Headers     business headers: a JSON object of string values,
                          e.g. N'{"X-Order-Id": "42"}'; at most 50
             @AccountName default: the default sending account
             @AppName     a registered application (mailq.UpsertApplication)
             @Priority    0-9, 9 first, default 5
             @DateToProcess  UTC time to send at, default now
             @ExpiresAtUtc   UTC time after which the mail is Expired unsent
             @MaxAttempts    1-20, default 5
             @IdempotencyKey <= 200 chars; see "Idempotency" below
             @Attachments    JSON array of {"FileName", "ContentType",
                          "ContentBase64"}; <= 10 files, 10 MiB each, 25 MiB in all
             NULL for an optional parameter means its default.
Outputs:     @MailID BIGINT, @MessageID NVARCHAR(255) (RFC 5322 Message-ID,
             sent unchanged by every attempt), @Created BIT (0 when an existing
             mail was returned for the idempotency key).  No result set, so the
             procedure can be called from triggers.
Idempotency: the key is global.  The same key with the same content (the
             parameters exactly as passed, attachments included) returns the
             first mail; with different content it raises 50116 and writes
             nothing.  A key is free again once PurgeMail deleted its mail.
Errors:      50101 no recipient in @ToAddress; 50102 an invalid address;
             50103 a value over its size; 50104 more than 100 recipients;
             50105 CR or LF in a header value (header injection);
             50106 @Headers not a JSON object of string values;
             50107 invalid header name; 50108 header would override a reserved one;
             50109 @Priority not 0-9; 50110 @ExpiresAtUtc not after the due time;
             50111 body over its limit; 50112 attachment count or size over limit;
             50113 attachment file name empty or path-like;
             50114 unknown (or no default) account; 50115 unknown application;
             50116 idempotency key reused with different content;
             50117 @Attachments malformed; 50118 @BodyFormat not Text or Html;
             50119 @MaxAttempts not 1-20; 50120 @Body missing; 50121 @Subject missing.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     DECLARE @ID BIGINT;
             EXEC mailq.EnqueueMail @ToAddress = N'ops@example.com',
                 @Subject = N'Nightly report', @Body = N'All jobs succeeded.',
                 @MailID = @ID OUTPUT;
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMail
    @ToAddress NVARCHAR(MAX),
    @Subject NVARCHAR(MAX),
    @Body NVARCHAR(MAX),
    @BodyFormat NVARCHAR(20) = N'Text',
    @TextBody NVARCHAR(MAX) = NULL,
    @CC NVARCHAR(MAX) = NULL,
    @BCC NVARCHAR(MAX) = NULL,
    @FromAddress NVARCHAR(MAX) = NULL,
    @FromName NVARCHAR(MAX) = NULL,
    @ReplyTo NVARCHAR(MAX) = NULL,
    @Headers NVARCHAR(MAX) = NULL,
    @AccountName NVARCHAR(4000) = NULL,
    @AppName NVARCHAR(4000) = NULL,
    @Priority INT = 5,
    @DateToProcess DATETIME2(3) = NULL,
    @ExpiresAtUtc DATETIME2(3) = NULL,
    @MaxAttempts INT = 5,
    @IdempotencyKey NVARCHAR(4000) = NULL,
    @Attachments NVARCHAR(MAX) = NULL,
    @MailID BIGINT = NULL OUTPUT,
    @MessageID NVARCHAR(255) = NULL OUTPUT,
    @Created BIT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Msg NVARCHAR(2048);
    DECLARE @CrLf NVARCHAR(10) = N'%[' + NCHAR(13) + NCHAR(10) + N']%';

    -- The content hash covers the parameters exactly as passed (before
    -- defaults), so that the same call is recognised as the same mail.
    DECLARE @ContentJson NVARCHAR(MAX) = (
        SELECT
            @ToAddress AS ToAddress, @CC AS CC, @BCC AS BCC, @Subject AS Subject,
            @Body AS Body, @BodyFormat AS BodyFormat, @TextBody AS TextBody,
            @FromAddress AS FromAddress, @FromName AS FromName, @ReplyTo AS ReplyTo,
            @Headers AS Headers, @AccountName AS AccountName, @AppName AS AppName,
            @Priority AS Priority, @DateToProcess AS DateToProcess,
            @ExpiresAtUtc AS ExpiresAtUtc, @MaxAttempts AS MaxAttempts,
            @Attachments AS Attachments
        FOR JSON PATH, WITHOUT_ARRAY_WRAPPER, INCLUDE_NULL_VALUES
    );

    SET @BodyFormat = COALESCE(@BodyFormat, N'Text');
    SET @Priority = COALESCE(@Priority, 5);
    SET @MaxAttempts = COALESCE(@MaxAttempts, 5);
    SET @DateToProcess = COALESCE(@DateToProcess, @Now);

    -- 1. Validate parameters before any transaction starts.
    IF @ToAddress IS NULL OR NOT EXISTS (SELECT 1 FROM mailq.ParseAddressList(@ToAddress))
        THROW 50101, N'@ToAddress is required: give at least one recipient address (separate several with ;).', 1;
    IF @Subject IS NULL
        THROW 50121, N'@Subject is required (pass N'''' for a mail without subject).', 1;
    IF @Body IS NULL
        THROW 50120, N'@Body is required.', 1;

    SELECT TOP (1)
        @Msg = CONCAT(v.ParamName, N' is ', LEN(v.Value), N' characters long; the limit is ', v.MaxLength, N'.')
    FROM (
        VALUES
        (1, N'@ToAddress', @ToAddress, 4000), (2, N'@CC', @CC, 4000), (3, N'@BCC', @BCC, 4000),
        (4, N'@Subject', @Subject, 900), (5, N'@FromAddress', @FromAddress, 320),
        (6, N'@FromName', @FromName, 200), (7, N'@ReplyTo', @ReplyTo, 320),
        (8, N'@AccountName', @AccountName, 128), (9, N'@AppName', @AppName, 128),
        (10, N'@IdempotencyKey', @IdempotencyKey, 200)
    ) AS v(Position, ParamName, Value, MaxLength)
    WHERE LEN(v.Value) > v.MaxLength
    ORDER BY v.Position;
    IF @Msg IS NOT NULL THROW 50103, @Msg, 1;

    SELECT TOP (1)
        @Msg = CONCAT(v.ParamName, N' contains CR or LF; header values must be one line (header injection is refused).')
    FROM (
        VALUES
        (1, N'@Subject', @Subject), (2, N'@FromName', @FromName), (3, N'@ReplyTo', @ReplyTo),
        (4, N'@FromAddress', @FromAddress), (5, N'@IdempotencyKey', @IdempotencyKey)
    ) AS v(Position, ParamName, Value)
    WHERE v.Value LIKE @CrLf
    ORDER BY v.Position;
    IF @Msg IS NOT NULL THROW 50105, @Msg, 1;

    SELECT TOP (1)
        @Msg = CONCAT(
            v.ParamName, N': address ''', LEFT(a.Address, 100), N''' ', a.Problem, N'.'
        )
    FROM (
        VALUES
        (1, N'@ToAddress', @ToAddress), (2, N'@CC', @CC), (3, N'@BCC', @BCC),
        (4, N'@ReplyTo', @ReplyTo), (5, N'@FromAddress', @FromAddress)
    ) AS v(Position, ParamName, Value)
    CROSS APPLY mailq.ParseAddressList(v.Value) AS a
    WHERE a.Problem IS NOT NULL
    ORDER BY v.Position;
    IF @Msg IS NOT NULL THROW 50102, @Msg, 1;

    IF (SELECT COUNT(*) FROM mailq.ParseAddressList(@ReplyTo)) > 1
        THROW 50102, N'@ReplyTo takes one address.', 1;
    IF (SELECT COUNT(*) FROM mailq.ParseAddressList(@FromAddress)) > 1
        THROW 50102, N'@FromAddress takes one address.', 1;

    DECLARE @RecipientCount INT = (
        SELECT COUNT(*)
        FROM (VALUES (@ToAddress), (@CC), (@BCC)) AS v(Value)
        CROSS APPLY mailq.ParseAddressList(v.Value)
    );
    IF @RecipientCount > 100
    BEGIN
        SET @Msg = CONCAT(N'@ToAddress, @CC and @BCC name ', @RecipientCount, N' recipients; the limit is 100.');
        THROW 50104, @Msg, 1;
    END;

    IF @BodyFormat NOT IN (N'Text', N'Html')
    BEGIN
        SET @Msg = CONCAT(N'@BodyFormat must be Text or Html; got ''', LEFT(@BodyFormat, 20), N'''.');
        THROW 50118, @Msg, 1;
    END;
    IF @Priority NOT BETWEEN 0 AND 9
    BEGIN
        SET @Msg = CONCAT(N'@Priority must be 0-9 (9 is sent first); got ', @Priority, N'.');
        THROW 50109, @Msg, 1;
    END;
    IF @MaxAttempts NOT BETWEEN 1 AND 20
    BEGIN
        SET @Msg = CONCAT(N'@MaxAttempts must be 1-20; got ', @MaxAttempts, N'.');
        THROW 50119, @Msg, 1;
    END;
    IF @ExpiresAtUtc <= @DateToProcess
    BEGIN
        SET @Msg = CONCAT(
            N'@ExpiresAtUtc (', CONVERT(NVARCHAR(30), @ExpiresAtUtc, 126),
            N') must be later than the due time (', CONVERT(NVARCHAR(30), @DateToProcess, 126), N').'
        );
        THROW 50110, @Msg, 1;
    END;
    IF LEN(@Body) > 2000000 OR LEN(@TextBody) > 2000000
        THROW 50111, N'@Body and @TextBody are limited to 2,000,000 characters each.', 1;

    -- Business headers: a JSON object whose values are strings.
    IF @Headers IS NOT NULL
    BEGIN
        IF ISJSON(@Headers) = 0 OR LEFT(LTRIM(@Headers), 1) <> N'{'
            THROW 50106, N'@Headers must be a JSON object of string values, e.g. {"X-Order-Id": "42"}.', 1;

        SELECT TOP (1) @Msg = CONCAT(N'@Headers: the value of ''', LEFT(j.[key], 80), N''' must be a JSON string.')
        FROM OPENJSON(@Headers) AS j
        WHERE j.[type] <> 1;
        IF @Msg IS NOT NULL THROW 50106, @Msg, 1;

        IF (SELECT COUNT(*) FROM OPENJSON(@Headers)) > 50
            THROW 50106, N'@Headers holds more than 50 headers.', 1;

        IF EXISTS (
            SELECT UPPER(j.[key]) AS HeaderName
            FROM OPENJSON(@Headers) AS j
            GROUP BY UPPER(j.[key])
            HAVING COUNT(*) > 1
        )
            THROW 50106, N'@Headers names one header twice.', 1;

        -- RFC 5322 field name: 1-76 printable US-ASCII characters except ':'
        -- (the binary collation makes the ranges code-point ranges).
        SELECT TOP (1) @Msg = CONCAT(
            N'@Headers: ''', LEFT(j.[key], 80), N''' is not a valid header name ',
            N'(1-76 printable ASCII characters, no space or colon).'
        )
        FROM OPENJSON(@Headers) AS j
        WHERE
            LEN(j.[key]) NOT BETWEEN 1 AND 76
            OR j.[key] COLLATE Latin1_General_BIN LIKE N'%[^!-9;-~]%';
        IF @Msg IS NOT NULL THROW 50107, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(N'@Headers: ''', j.[key], N''' is set by mailq-db and cannot be overridden.')
        FROM OPENJSON(@Headers) AS j
        WHERE UPPER(j.[key]) IN (
            N'FROM', N'TO', N'CC', N'BCC', N'SUBJECT', N'MESSAGE-ID', N'DATE', N'REPLY-TO',
            N'SENDER', N'RETURN-PATH', N'MIME-VERSION', N'CONTENT-TYPE',
            N'CONTENT-TRANSFER-ENCODING', N'CONTENT-DISPOSITION'
        );
        IF @Msg IS NOT NULL THROW 50108, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(
            N'@Headers: the value of ''', j.[key], N''' contains CR or LF (header injection is refused).'
        )
        FROM OPENJSON(@Headers) AS j
        WHERE j.[value] LIKE @CrLf;
        IF @Msg IS NOT NULL THROW 50105, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(N'@Headers: the value of ''', j.[key], N''' is longer than 900 characters.')
        FROM OPENJSON(@Headers) AS j
        WHERE LEN(j.[value]) > 900;
        IF @Msg IS NOT NULL THROW 50103, @Msg, 1;
    END;

    -- Account and application.
    DECLARE @ResolvedAccount NVARCHAR(128), @DefaultFrom NVARCHAR(320), @DefaultFromName NVARCHAR(200);
    SELECT
        @ResolvedAccount = a.AccountName,
        @DefaultFrom = a.DefaultFromAddress,
        @DefaultFromName = a.DefaultFromName
    FROM mailq.SendingAccount AS a
    WHERE
        (@AccountName IS NOT NULL AND a.AccountName = @AccountName)
        OR (@AccountName IS NULL AND a.IsDefault = 1);
    IF @ResolvedAccount IS NULL
    BEGIN
        SET @Msg = IIF(
            @AccountName IS NULL,
            N'@AccountName is NULL and no default sending account exists (mailq.UpsertSendingAccount @IsDefault = 1).',
            CONCAT(N'@AccountName ''', @AccountName, N''' is not a sending account (mailq.UpsertSendingAccount).')
        );
        THROW 50114, @Msg, 1;
    END;
    IF @AppName IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(N'@AppName ''', @AppName, N''' is not a registered application (mailq.UpsertApplication).');
        THROW 50115, @Msg, 1;
    END;

    SET @FromAddress = LTRIM(RTRIM(COALESCE(@FromAddress, @DefaultFrom)));
    SET @FromName = COALESCE(@FromName, @DefaultFromName);

    -- Attachments: decoded from base64 by OPENJSON ... WITH (VARBINARY), which
    -- raises an error for text that is not base64: caught and reported as 50117.
    DECLARE @Attachment TABLE (
        AttachmentNo INT NOT NULL PRIMARY KEY,
        FileName NVARCHAR(4000) NULL,
        ContentType NVARCHAR(4000) NULL,
        Content VARBINARY(MAX) NULL
    );
    IF @Attachments IS NOT NULL
    BEGIN
        IF ISJSON(@Attachments) = 0 OR LEFT(LTRIM(@Attachments), 1) <> N'['
            THROW 50117,
                N'@Attachments must be a JSON array of {"FileName", "ContentType", "ContentBase64"} objects.',
                1;
        IF EXISTS (SELECT 1 FROM OPENJSON(@Attachments) AS e WHERE e.[type] <> 5)
            THROW 50117, N'@Attachments: every element must be an object with FileName and ContentBase64.', 1;
        BEGIN TRY
            INSERT INTO @Attachment (AttachmentNo, FileName, ContentType, Content)
            SELECT
                CAST(e.[key] AS INT) + 1 AS AttachmentNo,
                f.FileName,
                f.ContentType,
                f.Content
            FROM OPENJSON(@Attachments) AS e
            CROSS APPLY OPENJSON (e.[value])
                WITH (
                    FileName NVARCHAR(4000) '$.FileName',
                    ContentType NVARCHAR(4000) '$.ContentType',
                    Content VARBINARY(MAX) '$.ContentBase64'
                ) AS f;
        END TRY
        BEGIN CATCH
            SET @Msg = CONCAT(N'@Attachments: ContentBase64 must be base64 text (', ERROR_MESSAGE(), N').');
            THROW 50117, @Msg, 1;
        END CATCH;

        IF EXISTS (SELECT 1 FROM @Attachment AS t WHERE t.Content IS NULL)
            THROW 50117, N'@Attachments: every element must be an object with FileName and ContentBase64.', 1;
        IF (SELECT COUNT(*) FROM @Attachment) > 10
            THROW 50112, N'@Attachments holds more than 10 attachments.', 1;

        SELECT TOP (1) @Msg = CONCAT(
            N'@Attachments: file name ''', LEFT(t.FileName, 100),
            N''' must be a bare file name (not empty, no path, no control characters, <= 255 characters).'
        )
        FROM @Attachment AS t
        WHERE
            NULLIF(LTRIM(RTRIM(t.FileName)), N'') IS NULL
            OR t.FileName LIKE N'%[/\:]%'
            OR t.FileName IN (N'.', N'..')
            OR t.FileName LIKE N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%'
            OR LEN(t.FileName) > 255
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50113, @Msg, 1;

        SELECT TOP (1)
            @Msg = CONCAT(N'@Attachments: content type of ''', t.FileName, N''' must look like type/subtype.')
        FROM @Attachment AS t
        WHERE
            t.ContentType IS NOT NULL
            AND (t.ContentType NOT LIKE N'_%/_%' OR t.ContentType LIKE @CrLf OR LEN(t.ContentType) > 255)
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50117, @Msg, 1;

        SELECT TOP (1) @Msg = CONCAT(
            N'@Attachments: ''', t.FileName, N''' is ', DATALENGTH(t.Content),
            N' bytes; the limit is 10485760 (10 MiB) per attachment.'
        )
        FROM @Attachment AS t
        WHERE DATALENGTH(t.Content) > 10485760
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50112, @Msg, 1;

        IF (SELECT SUM(CAST(DATALENGTH(t.Content) AS BIGINT)) FROM @Attachment AS t) > 26214400
            THROW 50112, N'@Attachments total more than 26214400 bytes (25 MiB) per mail.', 1;
    END;

    DECLARE @ContentHash VARBINARY(32) = HASHBYTES('SHA2_256', @ContentJson);
    DECLARE @Domain NVARCHAR(320) = SUBSTRING(@FromAddress, CHARINDEX(N'@', @FromAddress) + 1, 320);
    -- A Message-ID must be ASCII: a non-ASCII sender domain gets a neutral one.
    IF @Domain COLLATE Latin1_General_BIN LIKE N'%[^!-~]%' SET @Domain = N'mailq-db.invalid';

    -- 2. Own the transaction, or nest in the caller's with a savepoint.
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION EnqueueMail;

        DECLARE @ExistingHash VARBINARY(32);
        SET @MailID = NULL;
        IF @IdempotencyKey IS NOT NULL
        BEGIN
            -- UPDLOCK, HOLDLOCK: the key-range lock on UX_MailQueue_IdempotencyKey
            -- stops two sessions from both seeing the key absent and inserting.
            SELECT
                @MailID = q.ID,
                @MessageID = q.MessageID,
                @ExistingHash = q.ContentHash
            FROM mailq.MailQueue AS q WITH (UPDLOCK, HOLDLOCK)
            WHERE q.IdempotencyKey = @IdempotencyKey;

            IF @MailID IS NOT NULL AND @ExistingHash <> @ContentHash
            BEGIN
                SET @Msg = CONCAT(
                    N'@IdempotencyKey ''', @IdempotencyKey, N''' already belongs to mail ', @MailID,
                    N' with different content; use a new key for a different mail.'
                );
                THROW 50116, @Msg, 1;
            END;
        END;

        IF @MailID IS NOT NULL
            SET @Created = 0;
        ELSE
        BEGIN
            SET @MessageID = CONCAT(N'<', LOWER(CONVERT(NCHAR(36), NEWID())), N'@', @Domain, N'>');

            INSERT INTO mailq.MailQueue (
                dtStamp, DateToProcess, VisibleAtUtc, FromName, FromAddress, ReplyTo,
                ToAddress, CC, BCC, Subject, Body, BodyFormat, TextBody, Headers,
                Status, AttemptsRemaining, Priority, AccountName, AppName,
                IdempotencyKey, ContentHash, MessageID, ExpiresAtUtc
            )
            VALUES (
                @Now, @DateToProcess, @DateToProcess, @FromName, @FromAddress, LTRIM(RTRIM(@ReplyTo)),
                @ToAddress, @CC, @BCC, @Subject, @Body, @BodyFormat, @TextBody, @Headers,
                N'UnSent', @MaxAttempts, @Priority, @ResolvedAccount, @AppName,
                @IdempotencyKey, @ContentHash, @MessageID, @ExpiresAtUtc
            );
            SET @MailID = SCOPE_IDENTITY();

            INSERT INTO mailq.MailAttachment (MailID, AttachmentNo, FileName, ContentType, Content)
            SELECT
                @MailID,
                t.AttachmentNo,
                LTRIM(RTRIM(t.FileName)),
                COALESCE(t.ContentType, N'application/octet-stream'),
                t.Content
            FROM @Attachment AS t;

            SET @Created = 1;
        END;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION EnqueueMail;
        THROW;
    END CATCH;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.LockLeasedMail: the fence of every acknowledgement (internal: called by
ExtendLease, ReleaseMail, MarkSent and MarkFailed inside their transaction;
granted to no role).  Validates @ID / @IDList, then locks the named mails
WITH (UPDLOCK, ROWLOCK) until the caller's transaction ends and raises an
error unless every one of them exists, is Sending and holds @LockToken.  The
caller's UPDATE then cannot race a reclaim: a worker whose lease expired and
was reclaimed is told so and changes nothing (all or nothing).
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (a JSON array of 1-1000
             integers): exactly one; @LockToken UNIQUEIDENTIFIER, required
Result set:  none.
Errors:      50131 @LockToken missing; 50136 neither or both of @ID/@IDList;
             50137 @IDList malformed; 50201 unknown mail ID;
             50202 the mail is leased under another token (lease lost);
             50203 the mail is not Sending (already acknowledged or never claimed).
Transaction: must run inside the caller's transaction (raises 50138 otherwise).
Example:     EXEC mailq.LockLeasedMail @IDList = N'[1,2]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.LockLeasedMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @@TRANCOUNT = 0
        THROW 50138, N'mailq.LockLeasedMail must run inside the caller''s transaction.', 1;
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: the token the mails were claimed with.', 1;
    IF (@ID IS NULL AND @IDList IS NULL) OR (@ID IS NOT NULL AND @IDList IS NOT NULL)
        THROW 50136, N'Give exactly one of @ID (one mail) or @IDList (a JSON array of mail IDs).', 1;
    IF
        @IDList IS NOT NULL
        AND (
            ISJSON(@IDList) = 0
            OR LEFT(LTRIM(@IDList), 1) <> N'['
            OR EXISTS (
                SELECT 1
                FROM OPENJSON(@IDList) AS j
                WHERE j.[type] <> 2 OR TRY_CAST(j.[value] AS BIGINT) IS NULL
            )
            OR (SELECT COUNT(*) FROM OPENJSON(@IDList)) NOT BETWEEN 1 AND 1000
        )
        THROW 50137, N'@IDList must be a JSON array of 1-1000 integer mail IDs, e.g. [101, 102].', 1;

    DECLARE @Held TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        Status NVARCHAR(16) NULL,
        ThreadLock UNIQUEIDENTIFIER NULL
    );

    -- UPDLOCK, ROWLOCK: hold the rows until the caller commits, so the fence
    -- checked here still holds when the caller updates them.  No READPAST:
    -- these rows must be seen, and only a reclaiming worker could hold them.
    INSERT INTO @Held (ID, Status, ThreadLock)
    SELECT l.ID, q.Status, q.ThreadLock
    FROM mailq.ParseIDList(@ID, @IDList) AS l
    LEFT JOIN mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK) ON l.ID = q.ID;

    SELECT TOP (1) @Msg = CONCAT(N'Mail ', h.ID, N' does not exist.')
    FROM @Held AS h
    WHERE h.Status IS NULL
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50201, @Msg, 1;

    SELECT TOP (1) @Msg = CONCAT(
        N'Mail ', h.ID, N' is ', h.Status, N', not Sending: it was already acknowledged, released or never claimed.'
    )
    FROM @Held AS h
    WHERE h.Status <> N'Sending'
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50203, @Msg, 1;

    SELECT TOP (1) @Msg = CONCAT(
        N'Mail ', h.ID, N' is leased under another @LockToken: this worker''s lease expired and the mail ',
        N'was reclaimed; nothing was changed.'
    )
    FROM @Held AS h
    WHERE h.ThreadLock <> @LockToken
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50202, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
mailq.ParseAddressList: splits a ';'-separated list of e-mail addresses and
says what is wrong with each (inline, so it costs nothing outside the query).
Parameters:  @List NVARCHAR(MAX), NULL gives no rows
Returns:     Address NVARCHAR(MAX) (trimmed of spaces), Problem NVARCHAR(100)
             (NULL when the address is acceptable).  Empty entries are skipped.
Rules:       no CR, LF or other control character (header injection); no white
             space; at most 254 characters (RFC 5321); exactly one '@' with a
             non-empty local part and domain; no '<', '>', ',', ';', '"', '(',
             ')' or '\' (display names are not accepted in address lists); the
             domain neither starts nor ends with '.' nor contains '..'.
             Non-ASCII addresses are accepted here; the worker sends them only
             to servers that offer SMTPUTF8.
Example:     SELECT a.Address, a.Problem FROM mailq.ParseAddressList(N'a@x.org; b@') AS a;
*/
CREATE OR ALTER FUNCTION mailq.ParseAddressList(@List NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN
SELECT
    a.Address,
    CASE
        WHEN a.Address LIKE N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%'
            THEN N'contains CR, LF or another control character'
        WHEN a.Address LIKE N'% %' OR a.Address LIKE N'%' + NCHAR(160) + N'%'
            THEN N'contains white space'
        WHEN LEN(a.Address) > 254 THEN N'is longer than 254 characters'
        WHEN a.Address NOT LIKE N'%_@_%' THEN N'has no local part or no domain'
        WHEN a.Address LIKE N'%@%@%' THEN N'has more than one @'
        WHEN a.Address LIKE N'%[<>,;"()\]%' THEN N'contains a character not allowed in an address'
        WHEN a.Address LIKE N'%@.%' OR a.Address LIKE N'%.' OR a.Address LIKE N'%@%..%'
            THEN N'has a malformed domain'
    END AS Problem
FROM (
    SELECT LTRIM(RTRIM(s.value)) AS Address
    FROM STRING_SPLIT(@List, N';') AS s
) AS a
WHERE a.Address <> N'';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

/*
IX_MailQueue_Claim serves mailq.ClaimMail at any queue depth.

Keys (Priority DESC, VisibleAtUtc, ID), filtered to the claimable statuses,
so the index holds only UnSent and Sending rows (a sent backlog of millions
costs it nothing).  ClaimMail's predicate is
    Status IN (N'UnSent', N'Sending')            -- matches the filter
    AND Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
    AND VisibleAtUtc <= @Now
    ORDER BY Priority DESC, VisibleAtUtc, ID
Expected plan: Index Seek on IX_MailQueue_Claim with ten seek ranges
(Priority = p AND VisibleAtUtc <= @Now), read in key order, so the rows come
out already in ORDER BY order: no Sort over the backlog; Top (@BatchSize)
stops the seek after the first rows that pass the residual predicates
(account has budget, application); Key Lookup of the clustered index for the
UPDATE; Clustered Index Update.  Logical reads per claim then depend on the
batch size, not on the depth.  The integration suite checks the actual
showplan at 100 k rows (tests/integration/test_claim_plan.py).

INCLUDE covers the residual predicates (AccountName, AppName) without a
lookup for rows that are skipped.  ALLOW_PAGE_LOCKS = OFF keeps READPAST at
row grain (a page lock would make READPAST skip a whole page of due mail).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Claim' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailQueue_Claim
    ON mailq.MailQueue (Priority DESC, VisibleAtUtc ASC, ID ASC)
    INCLUDE (AccountName, AppName)
    WHERE Status IN (N'UnSent', N'Sending')
    WITH (ALLOW_PAGE_LOCKS = OFF);
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0003';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0003 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0002' WHERE dbo.mailq_alembic_version.version_num = '0003';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0002 -> 0001

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0002')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0002; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Activation INT = (
    SELECT CAST(q.is_activation_enabled AS INT) FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ'));
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = @Activation;
IF @Activation = 1
    ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.PendingTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.PendingTasks FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.RunningTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.RunningTasks FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.FailedTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.FailedTasks FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.RefusedTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.RefusedTasks FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Health') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.Health FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'dbo.CancelDelayExecution') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::dbo.CancelDelayExecution FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'dbo.InitiateDelayExecution') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::dbo.InitiateDelayExecution FROM MailqDelayCaller;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'dbo.CancelDelayExecution') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::dbo.CancelDelayExecution FROM MailqDelayCaller;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS delay.Health;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS delay.RefusedTasks;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS delay.FailedTasks;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS delay.RunningTasks;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS delay.PendingTasks;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS delay.DisallowProcedure;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS delay.AllowProcedure;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS dbo.CancelDelayExecution;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS dbo.InitiateDelayExecution;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TRIGGER IF EXISTS dbo.trg_tabDIYTable12402_ScheduleDelay;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') IS NOT NULL
    ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (DROP);

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS dbo.ProcessDelayQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS delay.FinishTask;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP FUNCTION IF EXISTS delay.ResolveTarget;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (SELECT 1 FROM sys.services WHERE name = N'MailqDelayService')
    DROP SERVICE MailqDelayService;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (SELECT 1 FROM sys.service_queues WHERE object_id = OBJECT_ID(N'dbo.DelayServiceQueue'))
    DROP QUEUE dbo.DelayServiceQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = N'MailqDelayContract')
    DROP CONTRACT MailqDelayContract;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = N'MailqDelayRequest')
    DROP MESSAGE TYPE MailqDelayRequest;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Installation', N'U') IS NOT NULL
BEGIN
    IF EXISTS (
        SELECT 1 FROM delay.Installation
        WHERE Item = N'dbo.tabDIYTable12402' AND Detail = N'created'
    )
        DROP TABLE IF EXISTS dbo.tabDIYTable12402;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Log') IS NOT NULL
    DROP INDEX IF EXISTS IX_Log_TaskID ON delay.Log;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS delay.Log;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Task') IS NOT NULL
    DROP INDEX IF EXISTS IX_Task_TaskState_NextRunAtUtc ON delay.Task;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.Task') IS NOT NULL
    DROP INDEX IF EXISTS UX_Task_ConversationHandle ON delay.Task;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS delay.Task;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'delay.AllowedProcedure') IS NOT NULL
    DROP INDEX IF EXISTS UX_AllowedProcedure_BareName ON delay.AllowedProcedure;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS delay.AllowedProcedure;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS delay.Setting;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS delay.Installation;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP SCHEMA IF EXISTS delay;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0002';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Activation INT = CAST(SESSION_CONTEXT(N'mailq_db.activation') AS INT);
IF @Activation IS NOT NULL AND EXISTS (
    SELECT 1 FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') AND q.activation_procedure IS NOT NULL)
BEGIN
    IF @Activation = 1
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON);
    ELSE
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);
END;
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = NULL;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0002 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

UPDATE dbo.mailq_alembic_version SET version_num='0001' WHERE dbo.mailq_alembic_version.version_num = '0002';

GO

COMMIT;

GO

BEGIN TRANSACTION;

-- Running downgrade 0001 -> 

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF NOT (@Rows = 1 AND @Current = '0001')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0001; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.EnqueueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ClaimMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ExtendLease') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ExtendLease FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ReleaseMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ReleaseMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkSent') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkSent FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkFailed') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkFailed FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RequeueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RequeueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.CancelMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.CancelMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.PurgeMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.PurgeMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertSendingAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UnblockSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UnblockSendingAccount FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.UpsertApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertApplication FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetQueueStats') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetQueueStats FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetInstallationHealth') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetInstallationHealth FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.QueueCountsByStatus') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.QueueCountsByStatus FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.OldestDueMail') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.OldestDueMail FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ThroughputPerHour') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.ThroughputPerHour FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.RecentFailures') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.RecentFailures FROM MailqAdmin;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ClaimMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimMail FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ExtendLease') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ExtendLease FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.ReleaseMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ReleaseMail FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkSent') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkSent FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MarkFailed') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkFailed FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.GetInstallationHealth') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetInstallationHealth FROM MailqSender;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.EnqueueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMail FROM MailqEnqueuer;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.GetInstallationHealth;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.GetQueueStats;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.UpsertApplication;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.UnblockSendingAccount;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.UpsertSendingAccount;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.PurgeMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.RequeueMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.CancelMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.MarkFailed;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.MarkSent;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.ReleaseMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.ExtendLease;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.ClaimMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.EnqueueMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP PROCEDURE IF EXISTS mailq.LockLeasedMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.RecentFailures;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.ThroughputPerHour;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.OldestDueMail;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP VIEW IF EXISTS mailq.QueueCountsByStatus;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP FUNCTION IF EXISTS mailq.ParseIDList;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP FUNCTION IF EXISTS mailq.ParseAddressList;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.SendingAccount') IS NOT NULL
    DROP INDEX IF EXISTS UX_SendingAccount_IsDefault ON mailq.SendingAccount;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailAttempt') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailAttempt_EndedAtUtc ON mailq.MailAttempt;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_Final ON mailq.MailQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS UX_MailQueue_IdempotencyKey ON mailq.MailQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_Claim ON mailq.MailQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.MailAttempt;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.MailAttachment;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.MailQueue;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.Application;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.RateBudget;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS mailq.SendingAccount;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF DATABASE_PRINCIPAL_ID(N'MailqDelayCaller') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqDelayCaller DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqDelayCaller');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqDelayCaller;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF DATABASE_PRINCIPAL_ID(N'MailqAdmin') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqAdmin DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqAdmin');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqAdmin;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF DATABASE_PRINCIPAL_ID(N'MailqSender') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqSender DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqSender');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqSender;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

IF DATABASE_PRINCIPAL_ID(N'MailqEnqueuer') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqEnqueuer DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqEnqueuer');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqEnqueuer;
END;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP SCHEMA IF EXISTS mailq;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0001';

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DROP TABLE IF EXISTS dbo.mailq_deployment_file;
DROP TABLE IF EXISTS dbo.mailq_deployment_option;

GO

IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
IF @@TRANCOUNT = 0
BEGIN
    RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1);
    SET NOEXEC ON;
END;

GO

DELETE FROM dbo.mailq_alembic_version WHERE dbo.mailq_alembic_version.version_num = '0001';

GO

COMMIT;

GO

SET NOEXEC OFF;

GO

IF APPLOCK_MODE(N'public', N'mailq-db deploy', N'Session') = N'Exclusive'
    EXEC sys.sp_releaseapplock @Resource = N'mailq-db deploy', @LockOwner = N'Session';

GO

