/*
mailq.EnqueueMail: validates one mail and queues it; with an idempotency key
that is already queued it returns the existing mail and inserts nothing.
Parameters:  @ToAddress   NVARCHAR(MAX), required: ';'-separated entries, each
                          an address or 'Display Name <address>'
             @Subject     NVARCHAR(MAX), required (N'' for none), <= 900 chars;
                          omitted (NULL) with @TemplateName (revision 0016)
             @Body        NVARCHAR(MAX), required, <= 2,000,000 chars; omitted
                          (NULL) with @TemplateName.  Both default to NULL so
                          that a template call can leave them out (50121 /
                          50120 when neither they nor a template are given)
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
                          "ContentBase64"}; <= 10 files, 10 MiB each, 25 MiB in all.
                          A lazy attachment names a generator instead of
                          "ContentBase64": {"FileName", "ContentType",
                          "Generator": "csv", "Arguments": {...}} (revision
                          0016): the worker calls the generator at send time
                          and holds its output to the same limits
             @TemplateName   (revision 0016) a template (mailq.AddMailTemplateVersion)
                          instead of @Subject/@Body/@TextBody: the worker
                          renders subject and body at send time from
                          @TemplateModel (docs/templates.md); not retired
             @TemplateVersion  pin a version of it; NULL: the latest active
                          version when the mail is claimed (mailq.ClaimMail)
             @TemplateModel  the model, a JSON object text; NULL means {}
             @RunMode        the run mode the mail belongs to (revision 0015):
                          a name of 1-32 characters, a-z first, then a-z 0-9
                          '-' '_' (e.g. 'prod', 'staging', 'test'); default
                          'prod'.  Only workers serving that run mode claim
                          it (ClaimMail @RunModes, docs/run-modes.md).
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
             50240 @RunMode not a valid run-mode name;
             50160 the application may not send through @AccountName;
             50161 the application may not send as @FromAddress;
             50162 the idempotency key's lock was not granted in 10 s (or deadlock);
             50168 the calling database user is mapped to another application;
             50600 every recipient is suppressed for the account/application
                   (suppressed recipients of a mail with others left are
                   dropped with a RecipientSuppressed event, docs/bounces.md);
             (revision 0016, templates and lazy attachments)
             50280 @TemplateName together with @Subject, @Body or @TextBody;
             50281 @TemplateVersion or @TemplateModel without @TemplateName;
             50282 unknown @TemplateName, or no such @TemplateVersion;
             50283 the template is retired; 50284 @TemplateModel not a JSON object;
             50285 @TemplateVersion not >= 1, or @TemplateName not a template name;
             50286 a lazy attachment malformed (Generator name, Arguments not an
                   object, or both ContentBase64 and Generator).
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
Lock order:  the application lock on the key, then mailq.Suppression (shared
             key ranges of the recipients, held), then mailq.MailQueue (insert,
             with its Enqueued row in mailq.MailEvent), then
             mailq.MailAttachment (docs/guarantees.md, "Lock order").
             The template check (mailq.MailTemplate, one seek, S lock released
             at once) runs in validation, before the transaction.
Example:     DECLARE @ID BIGINT;
             EXEC mailq.EnqueueMail @ToAddress = N'ops@example.com',
                 @Subject = N'Nightly report', @Body = N'All jobs succeeded.',
                 @MailID = @ID OUTPUT;
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMail
    @ToAddress NVARCHAR(MAX),
    @Subject NVARCHAR(MAX) = NULL,
    @Body NVARCHAR(MAX) = NULL,
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
    @Created BIT = NULL OUTPUT,
    @RunMode NVARCHAR(4000) = NULL,
    -- Revision 0016 (templates), appended at the end of the list.
    @TemplateName NVARCHAR(4000) = NULL,
    @TemplateVersion INT = NULL,
    @TemplateModel NVARCHAR(MAX) = NULL
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
    -- Run mode (revision 0015): part of the content when given, so a key
    -- reused under another run mode is 50116; appended only when given, so
    -- the hash of every call that does not pass it is unchanged (a retry
    -- across the upgrade still finds its mail).
    IF @RunMode IS NOT NULL SET @ContentJson = CONCAT(@ContentJson, N'|RunMode=', @RunMode);
    -- Revision 0016: the template parameters join the hash only when given,
    -- so the hash of ordinary mail is the one earlier revisions stored (an
    -- idempotency key retried across the upgrade still matches its mail).
    IF @TemplateName IS NOT NULL OR @TemplateVersion IS NOT NULL OR @TemplateModel IS NOT NULL
        SET @ContentJson = CONCAT(
            @ContentJson,
            (
                SELECT @TemplateName AS TemplateName, @TemplateVersion AS TemplateVersion,
                    @TemplateModel AS TemplateModel
                FOR JSON PATH, WITHOUT_ARRAY_WRAPPER
            )
        );

    SET @BodyFormat = COALESCE(@BodyFormat, N'Text');
    IF @TemplateName IS NOT NULL SET @BodyFormat = N'Text';  -- stored placeholder; the render decides
    SET @Priority = COALESCE(@Priority, 5);
    SET @MaxAttempts = COALESCE(@MaxAttempts, 5);
    SET @DateToProcess = COALESCE(@DateToProcess, @Now);

    -- 1. Validate parameters before any transaction starts.
    IF @ToAddress IS NULL OR NOT EXISTS (SELECT 1 FROM mailq.ParseAddressList(@ToAddress))
        THROW 50101, N'@ToAddress is required: give at least one recipient address (separate several with ;).', 1;
    -- Revision 0016: a template instead of @Subject / @Body / @TextBody.
    IF @TemplateName IS NULL AND (@TemplateVersion IS NOT NULL OR @TemplateModel IS NOT NULL)
        THROW 50281, N'@TemplateVersion and @TemplateModel need @TemplateName.', 1;
    IF @TemplateName IS NOT NULL
    BEGIN
        IF @Body IS NOT NULL OR @TextBody IS NOT NULL OR NULLIF(@Subject, N'') IS NOT NULL
            THROW 50280,
                N'@TemplateName renders the subject and the body: leave @Subject, @Body and @TextBody NULL.',
                1;
        SET @Subject = N'';
        SET @Body = N'';
    END;

    IF @Subject IS NULL
        THROW 50121, N'@Subject is required (pass N'''' for a mail without subject).', 1;
    IF @Body IS NULL
        THROW 50120, N'@Body is required (or @TemplateName and @TemplateModel).', 1;

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

    -- Run mode (revision 0015): the rule of CK_MailQueue_RunMode, binary
    -- comparison (a-z means a-z only, whatever the database collation).
    SET @RunMode = COALESCE(@RunMode, N'prod');
    IF LEN(@RunMode) NOT BETWEEN 1 AND 32
        OR @RunMode COLLATE Latin1_General_100_BIN2 NOT LIKE N'[a-z]%'
        OR @RunMode COLLATE Latin1_General_100_BIN2 LIKE N'%[^a-z0-9_-]%'
    BEGIN
        SET @Msg = CONCAT(
            N'@RunMode must be a run-mode name of 1-32 characters, a-z first, then a-z 0-9 - _ ',
            N'(e.g. prod, staging, test); got ''',
            LEFT(@RunMode, 40), N'''.'
        );
        THROW 50240, @Msg, 1;
    END;

    -- Revision 0016: the template and its model.  The template must exist
    -- and not be retired (a retired template takes no new mail, pinned or
    -- not: mailq.RetireMailTemplate); a pinned version must exist (versions
    -- are never deleted: trg_MailTemplateVersion_Immutable).  The model is
    -- a JSON object (at most 2,000,000 characters, the renderer's limit).
    IF @TemplateName IS NOT NULL
    BEGIN
        IF LEN(@TemplateName) NOT BETWEEN 1 AND 128
            OR @TemplateName COLLATE Latin1_General_100_BIN2 LIKE N'%[^A-Za-z0-9._-]%'
            OR @TemplateVersion < 1
        BEGIN
            SET @Msg = CONCAT(
                N'@TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ - and @TemplateVersion >= 1; ',
                N'got ''', LEFT(@TemplateName, 130), N''' version ',
                COALESCE(CONVERT(NVARCHAR(12), @TemplateVersion), N'NULL'), N'.'
            );
            THROW 50285, @Msg, 1;
        END;
        SET @TemplateModel = COALESCE(@TemplateModel, N'{}');
        IF LEN(@TemplateModel) > 2000000 OR ISJSON(@TemplateModel) = 0 OR LEFT(LTRIM(@TemplateModel), 1) <> N'{'
            THROW 50284,
                N'@TemplateModel must be a JSON object (its keys are the variables), <= 2,000,000 characters.',
                1;

        DECLARE @TemplateRetired DATETIME2(3), @TemplateLatest INT;
        SELECT @TemplateLatest = t.LatestVersion, @TemplateRetired = t.RetiredAtUtc
        FROM mailq.MailTemplate AS t
        WHERE t.TemplateName = @TemplateName;
        IF @TemplateLatest IS NULL OR @TemplateVersion > @TemplateLatest
        BEGIN
            SET @Msg = CONCAT(
                N'@TemplateName ''', @TemplateName, N'''',
                IIF(@TemplateLatest IS NULL, N' is not a template (mailq.AddMailTemplateVersion).',
                    CONCAT(N' has no version ', @TemplateVersion, N' (latest: ', @TemplateLatest, N').'))
            );
            THROW 50282, @Msg, 1;
        END;
        IF @TemplateRetired IS NOT NULL
        BEGIN
            SET @Msg = CONCAT(
                N'@TemplateName ''', @TemplateName,
                N''' is retired (mailq.RetireMailTemplate @Retire = 0 brings it back).'
            );
            THROW 50283, @Msg, 1;
        END;
    END;

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
        Content VARBINARY(MAX) NULL,
        Generator NVARCHAR(4000) NULL,       -- revision 0016: lazy attachment
        GeneratorArgs NVARCHAR(MAX) NULL,
        GeneratorArgsText NVARCHAR(MAX) NULL -- "Arguments" when it is not an object or array
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
            INSERT INTO @Attachment (
                AttachmentNo, FileName, ContentType, Content, Generator, GeneratorArgs, GeneratorArgsText
            )
            SELECT
                CAST(e.[key] AS INT) + 1 AS AttachmentNo,
                f.FileName,
                f.ContentType,
                f.Content,
                f.Generator,
                f.GeneratorArgs,
                f.GeneratorArgsText
            FROM OPENJSON(@Attachments) AS e
            CROSS APPLY OPENJSON (e.[value])
                WITH (
                    FileName NVARCHAR(4000) '$.FileName',
                    ContentType NVARCHAR(4000) '$.ContentType',
                    Content VARBINARY(MAX) '$.ContentBase64',
                    -- AS JSON: an object or array value (NULL for a scalar);
                    -- without it, the scalar (NULL for an object): OPENJSON (Transact-SQL), "AS JSON".
                    Generator NVARCHAR(4000) '$.Generator',
                    GeneratorArgs NVARCHAR(MAX) '$.Arguments' AS JSON,
                    GeneratorArgsText NVARCHAR(MAX) '$.Arguments'
                ) AS f;
        END TRY
        BEGIN CATCH
            SET @Msg = CONCAT(N'@Attachments: ContentBase64 must be base64 text (', ERROR_MESSAGE(), N').');
            THROW 50117, @Msg, 1;
        END CATCH;

        IF EXISTS (SELECT 1 FROM @Attachment AS t WHERE t.Content IS NULL AND t.Generator IS NULL)
            THROW 50117, N'@Attachments: every element must be an object with FileName and ContentBase64.', 1;
        -- Revision 0016: lazy attachments ("Generator" + optional "Arguments" object).
        SELECT TOP (1) @Msg = CONCAT(
            N'@Attachments: attachment ', t.AttachmentNo, N' (''', LEFT(t.FileName, 100), N'''): ',
            CASE
                WHEN t.Content IS NOT NULL THEN N'give ContentBase64 or Generator, not both.'
                WHEN t.GeneratorArgsText IS NOT NULL OR LEFT(LTRIM(t.GeneratorArgs), 1) <> N'{'
                    THEN N'Arguments must be a JSON object.'
                ELSE N'Generator must be 1-128 characters of A-Z a-z 0-9 . _ - (an entry point name).'
            END
        )
        FROM @Attachment AS t
        WHERE
            t.Generator IS NOT NULL
            AND (
                t.Content IS NOT NULL
                OR t.GeneratorArgsText IS NOT NULL
                OR LEFT(LTRIM(t.GeneratorArgs), 1) <> N'{'
                OR LEN(t.Generator) NOT BETWEEN 1 AND 128
                OR t.Generator COLLATE Latin1_General_100_BIN2 LIKE N'%[^A-Za-z0-9._-]%'
            )
        ORDER BY t.AttachmentNo;
        IF @Msg IS NOT NULL THROW 50286, @Msg, 1;
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
            -- >>> suppression (issue 28, docs/bounces.md): recipients suppressed
            -- for this account and application are left out (event
            -- RecipientSuppressed below); a mail left with nobody is refused
            -- (50600).  mailq.FilterSuppressedRecipients keeps share locks on
            -- the addresses' key ranges to the end of the transaction, so a
            -- suppression being added waits for this mail and then sweeps it.
            DECLARE @Suppressed NVARCHAR(MAX), @EntriesLeft INT;
            SELECT
                @ToAddress = ISNULL(f.ToAddress, N''), @CC = f.CC, @BCC = f.BCC,
                @Suppressed = f.Suppressed, @EntriesLeft = f.EntriesLeft
            FROM mailq.FilterSuppressedRecipients(@ResolvedAccount, @AppName, @ToAddress, @CC, @BCC) AS f
            WHERE f.SuppressedCount > 0;
            IF @Suppressed IS NOT NULL AND @EntriesLeft = 0
            BEGIN
                SET @Msg = LEFT(CONCAT(N'Every recipient is suppressed for account ''', @ResolvedAccount,
                    IIF(@AppName IS NULL, N'''', CONCAT(N''' and application ''', @AppName, N'''')),
                    N' (bounced, complained or unsubscribed; mailq.ListSuppressions): ', @Suppressed), 2048);
                THROW 50600, @Msg, 1;
            END;
            -- <<< suppression

            SET @MessageID = CONCAT(N'<', LOWER(CONVERT(NCHAR(36), NEWID())), N'@', @Domain, N'>');

            INSERT INTO mailq.MailQueue (
                dtStamp, DateToProcess, VisibleAtUtc, FromName, FromAddress, ReplyTo,
                ToAddress, CC, BCC, Subject, Body, BodyFormat, TextBody, Headers,
                Status, AttemptsRemaining, Priority, AccountName, AppName,
                IdempotencyKey, ContentHash, MessageID, ExpiresAtUtc,
                RunMode,
                TemplateName, TemplateVersion, TemplateModel  -- revision 0016
            )
            -- The Enqueued event in the same statement (docs/events.md).
            OUTPUT
                inserted.ID, inserted.AppName, N'Enqueued', inserted.Status, inserted.AttemptCount,
                NULL, NULL, inserted.dtStamp
            INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
            VALUES (
                @Now, @DateToProcess, @DateToProcess, @FromName, @FromAddress, LTRIM(RTRIM(@ReplyTo)),
                @ToAddress, @CC, @BCC, @Subject, @Body, @BodyFormat, @TextBody, @Headers,
                N'UnSent', @MaxAttempts, @Priority, @ResolvedAccount, @AppName,
                @IdempotencyKey, @ContentHash, @MessageID, @ExpiresAtUtc,
                @RunMode,
                @TemplateName, @TemplateVersion, @TemplateModel
            );
            SET @MailID = SCOPE_IDENTITY();

            -- >>> suppression: the recipients left out, in the event stream
            IF @Suppressed IS NOT NULL
                INSERT INTO mailq.MailEvent (
                    MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc
                )
                VALUES (
                    @MailID, @AppName, N'RecipientSuppressed', N'UnSent', 0, NULL,
                    LEFT(CONCAT(N'not sent to (suppressed): ', @Suppressed), 4000), @Now
                );
            -- <<< suppression

            INSERT INTO mailq.MailAttachment (
                MailID, AttachmentNo, FileName, ContentType, Content, Generator, GeneratorArgs
            )
            SELECT
                @MailID,
                t.AttachmentNo,
                LTRIM(RTRIM(t.FileName)),
                COALESCE(t.ContentType, N'application/octet-stream'),
                t.Content,
                t.Generator,
                IIF(t.Generator IS NULL, NULL, t.GeneratorArgs)
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
