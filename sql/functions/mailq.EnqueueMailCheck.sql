/*
mailq.EnqueueMailCheck: THE rules of enqueueing one mail (docs/enqueue.md), its
defaults and its idempotency content hash; inline in mailq.EnqueueMailRows, its
one caller, for a single call and every batch row alike.
Parameters:  mailq.MailBatchRow's 23 fields in column order (NULL = default);
             @InputField/@InputMessage (rule 50223); @P N'@' (messages name
             parameters) or N'' (batch fields); @Now; @User; @PrincipalApp;
             @AllowUnmapped; @TemplateLatest, @TemplateRetired (read by the caller).
Returns:     one row: the values to store, defaults applied; KeyText; Domain (of the
             Message-ID); ContentHash (SHA-256 of the normalized content); and the
             FIRST broken rule by RuleOrder: ErrorNumber, Field, Message (NULL if
             valid).  The suppression rule (50600) is EnqueueMailRows'.
Errors:      none raised: JSON functions read only text IIF proved to be JSON.
Example:     see mailq.EnqueueMailRows.
*/
CREATE OR ALTER FUNCTION mailq.EnqueueMailCheck(
    @ToAddress NVARCHAR(MAX), @Subject NVARCHAR(MAX), @Body NVARCHAR(MAX), @BodyFormat NVARCHAR(20),
    @TextBody NVARCHAR(MAX), @CC NVARCHAR(MAX), @BCC NVARCHAR(MAX), @FromAddress NVARCHAR(MAX),
    @FromName NVARCHAR(MAX), @ReplyTo NVARCHAR(MAX), @Headers NVARCHAR(MAX), @AccountName NVARCHAR(4000),
    @AppName NVARCHAR(4000), @Priority INT, @DateToProcess DATETIME2(3), @ExpiresAtUtc DATETIME2(3),
    @MaxAttempts INT, @IdempotencyKey NVARCHAR(4000), @Attachments NVARCHAR(MAX), @RunMode NVARCHAR(4000),
    @TemplateName NVARCHAR(4000), @TemplateVersion INT, @TemplateModel NVARCHAR(MAX),
    @InputField NVARCHAR(128), @InputMessage NVARCHAR(2048), @P NVARCHAR(1), @Now DATETIME2(3),
    @User NVARCHAR(128), @PrincipalApp NVARCHAR(128), @AllowUnmapped BIT, @TemplateLatest INT,
    @TemplateRetired DATETIME2(3)
)
RETURNS TABLE
AS
RETURN
-- n: the defaults, and what the rules look up (one row).
WITH n AS (
    SELECT
        a.AccountName,
        IIF(@TemplateName IS NULL, @Subject, N'') AS Subject,   -- a template renders subject and body
        IIF(@TemplateName IS NULL, @Body, N'') AS Body,
        IIF(@TemplateName IS NULL, COALESCE(@BodyFormat, N'Text'), N'Text') AS BodyFormat,
        LEFT(LTRIM(RTRIM(COALESCE(@FromAddress, a.DefaultFrom))), 320) AS FromAddress,
        LEFT(COALESCE(@FromName, a.DefaultFromName), 200) AS FromName,
        LTRIM(RTRIM(@ReplyTo)) AS ReplyTo,
        LEFT(COALESCE(@PrincipalApp, @AppName), 128) AS AppName,
        COALESCE(@Priority, 5) AS Priority,
        COALESCE(@DateToProcess, @Now) AS DueUtc,
        COALESCE(@MaxAttempts, 5) AS MaxAttempts,
        COALESCE(@RunMode, N'prod') AS RunMode,
        IIF(@TemplateName IS NULL, @TemplateModel, COALESCE(@TemplateModel, N'{}')) AS TemplateModel,
        IIF(ISJSON(@Headers) = 1 AND LEFT(LTRIM(@Headers), 1) = N'{', @Headers, NULL) AS HeadersJson,
        N'%[' + NCHAR(13) + NCHAR(10) + N']%' AS CrLf,
        (SELECT COUNT(*) FROM mailq.ParseAddressList(@ReplyTo)) AS ReplyToCount,
        (SELECT COUNT(*) FROM mailq.ParseAddressList(@FromAddress)) AS FromCount,
        (SELECT COUNT(x.DisplayName) FROM mailq.ParseAddressList(@FromAddress) AS x) AS FromNames,
        (
            SELECT COUNT(*) FROM (VALUES (@ToAddress), (@CC), (@BCC)) AS v(List)
            CROSS APPLY mailq.ParseAddressList(v.List)
        ) AS Recipients
    -- The account named, or the default one; MAX makes one row either way.
    FROM (
        SELECT
            MAX(s.AccountName) AS AccountName, MAX(s.DefaultFromAddress) AS DefaultFrom,
            MAX(s.DefaultFromName) AS DefaultFromName
        FROM mailq.SendingAccount AS s
        WHERE s.AccountName = COALESCE(@AccountName, (
            SELECT x.AccountName FROM mailq.SendingAccount AS x WHERE x.IsDefault = 1
        ))
    ) AS a
),

-- Every broken rule: (RuleOrder, Position, Item) orders them; the first one wins.
problems AS (
    SELECT v.RuleOrder, 0 AS Position, 0 AS Item, v.ErrorNumber, v.Field, v.Message
    FROM n
    CROSS APPLY (VALUES
        (1, 50500, N'AppName', IIF(@PrincipalApp IS NULL AND @AllowUnmapped = 0, 1, 0), CONCAT(
            N'Database user ', QUOTENAME(@User), N' is not mapped to an application, and this installation ',
            N'refuses unmapped enqueuers: an administrator maps it with EXEC mailq.BindApplication ',
            N'@AppName = N''<application>'', @PrincipalName = N''', REPLACE(@User, N'''', N''''''), N''';')),
        (2, 50223, @InputField, IIF(@InputMessage IS NULL, 0, 1), @InputMessage),
        (3, 50101, N'ToAddress', IIF(n.Recipients = 0, 1, 0), CONCAT(@P, N'ToAddress, ', @P, N'CC and ', @P,
            N'BCC name no recipient: give at least one address in any of them (separate several with ;).')),
        (4, 50281, N'TemplateName',
            IIF(@TemplateName IS NULL AND (@TemplateVersion IS NOT NULL OR @TemplateModel IS NOT NULL), 1, 0),
            CONCAT(@P, N'TemplateVersion and ', @P, N'TemplateModel need ', @P, N'TemplateName.')),
        (5, 50280, N'TemplateName', IIF(@TemplateName IS NOT NULL
                AND (@Body IS NOT NULL OR @TextBody IS NOT NULL OR NULLIF(@Subject, N'') IS NOT NULL), 1, 0),
            CONCAT(@P, N'TemplateName renders the subject and the body: leave ', @P, N'Subject, ', @P,
                N'Body and ', @P, N'TextBody NULL.')),
        (6, 50121, N'Subject', IIF(n.Subject IS NULL, 1, 0),
            CONCAT(@P, N'Subject is required (pass N'''' for a mail without subject).')),
        (7, 50120, N'Body', IIF(n.Body IS NULL, 1, 0),
            CONCAT(@P, N'Body is required (or ', @P, N'TemplateName and ', @P, N'TemplateModel).')),
        (11, 50102, N'ReplyTo', IIF(n.ReplyToCount > 1, 1, 0), CONCAT(@P, N'ReplyTo takes one address.')),
        (12, 50102, N'FromAddress', IIF(n.FromCount > 1, 1, 0), CONCAT(@P, N'FromAddress takes one address.')),
        (13, 50102, N'FromAddress', IIF(n.FromNames > 0, 1, 0),
            CONCAT(@P, N'FromAddress takes a bare address; give the display name in ', @P, N'FromName.')),
        (14, 50104, N'ToAddress', IIF(n.Recipients > 100, 1, 0), CONCAT(@P, N'ToAddress, ', @P, N'CC and ', @P,
            N'BCC name ', n.Recipients, N' recipients together; the limit is 100.')),
        (15, 50118, N'BodyFormat', IIF(n.BodyFormat NOT IN (N'Text', N'Html'), 1, 0),
            CONCAT(@P, N'BodyFormat must be Text or Html; got ''', LEFT(n.BodyFormat, 20), N'''.')),
        (16, 50109, N'Priority', IIF(n.Priority NOT BETWEEN 0 AND 9, 1, 0),
            CONCAT(@P, N'Priority must be 0-9 (9 is sent first); got ', n.Priority, N'.')),
        (17, 50119, N'MaxAttempts', IIF(n.MaxAttempts NOT BETWEEN 1 AND 20, 1, 0),
            CONCAT(@P, N'MaxAttempts must be 1-20; got ', n.MaxAttempts, N'.')),
        (18, 50110, N'ExpiresAtUtc', IIF(@ExpiresAtUtc <= n.DueUtc, 1, 0), CONCAT(@P, N'ExpiresAtUtc (',
            CONVERT(NVARCHAR(30), @ExpiresAtUtc, 126), N') must be later than the due time (',
            CONVERT(NVARCHAR(30), n.DueUtc, 126), N').')),
        (19, 50111, N'Body', IIF(LEN(@Body) > 2000000 OR LEN(@TextBody) > 2000000, 1, 0),
            CONCAT(@P, N'Body and ', @P, N'TextBody are limited to 2,000,000 characters each.')),
        -- The rule of CK_MailQueue_RunMode, compared as binary (a-z means a-z only).
        (20, 50240, N'RunMode', IIF(LEN(n.RunMode) NOT BETWEEN 1 AND 32
                OR n.RunMode COLLATE Latin1_General_100_BIN2 NOT LIKE N'[a-z]%'
                OR n.RunMode COLLATE Latin1_General_100_BIN2 LIKE N'%[^a-z0-9_-]%', 1, 0),
            CONCAT(@P, N'RunMode must be a run-mode name of 1-32 characters, a-z first, then a-z 0-9 - _ ',
                N'(e.g. prod, staging, test); got ''', LEFT(n.RunMode, 40), N'''.')),
        (21, 50285, N'TemplateName', IIF(@TemplateName IS NOT NULL AND (LEN(@TemplateName) NOT BETWEEN 1 AND 128
                OR @TemplateName COLLATE Latin1_General_100_BIN2 LIKE N'%[^A-Za-z0-9._-]%'
                OR @TemplateVersion < 1), 1, 0),
            CONCAT(@P, N'TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ - and ', @P,
                N'TemplateVersion >= 1; got ''', LEFT(@TemplateName, 130), N''' version ',
                COALESCE(CONVERT(NVARCHAR(12), @TemplateVersion), N'NULL'), N'.')),
        (22, 50284, N'TemplateModel', IIF(@TemplateName IS NOT NULL AND (LEN(n.TemplateModel) > 2000000
                OR ISJSON(n.TemplateModel) = 0 OR LEFT(LTRIM(n.TemplateModel), 1) <> N'{'), 1, 0),
            CONCAT(@P, N'TemplateModel must be a JSON object (its keys are the variables), <= 2,000,000 characters.')),
        (23, 50282, N'TemplateName', IIF(@TemplateName IS NOT NULL
                AND (@TemplateLatest IS NULL OR @TemplateVersion > @TemplateLatest), 1, 0),
            CONCAT(@P, N'TemplateName ''', LEFT(@TemplateName, 130), N'''',
                IIF(@TemplateLatest IS NULL, N' is not a template (mailq.AddMailTemplateVersion).',
                    CONCAT(N' has no version ', @TemplateVersion, N' (latest: ', @TemplateLatest, N').')))),
        (24, 50283, N'TemplateName', IIF(@TemplateRetired IS NOT NULL AND @TemplateName IS NOT NULL, 1, 0),
            CONCAT(@P, N'TemplateName ''', LEFT(@TemplateName, 130),
                N''' is retired (mailq.RetireMailTemplate @Retire = 0 brings it back).')),
        (25, 50106, N'Headers', IIF(@Headers IS NOT NULL AND n.HeadersJson IS NULL, 1, 0),
            CONCAT(@P, N'Headers must be a JSON object of string values, e.g. {"X-Order-Id": "42"}.')),
        (27, 50168, N'AppName', IIF(@AppName <> @PrincipalApp, 1, 0), CONCAT(N'Database user ', QUOTENAME(@User),
            N' enqueues as application ''', @PrincipalApp, N''' only; got ', @P, N'AppName ''', LEFT(@AppName, 128),
            N'''.')),
        (28, 50114, N'AccountName', IIF(n.AccountName IS NULL, 1, 0), IIF(@AccountName IS NULL,
            CONCAT(@P, N'AccountName is NULL and no default sending account exists ',
                N'(mailq.UpsertSendingAccount @AccountName = ..., @IsDefault = 1).'),
            CONCAT(@P, N'AccountName ''', LEFT(@AccountName, 128),
                N''' is not a sending account (mailq.UpsertSendingAccount).'))),
        (29, 50115, N'AppName', IIF(n.AppName IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = n.AppName), 1, 0),
            CONCAT(@P, N'AppName ''', n.AppName, N''' is not a registered application (mailq.UpsertApplication).')),
        (30, 50160, N'AccountName', IIF(n.AppName IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM mailq.ApplicationAccount AS b
                WHERE b.AppName = n.AppName AND b.AccountName = n.AccountName
            ), 1, 0), CONCAT(N'Application ''', n.AppName, N''' may not send through account ''', n.AccountName,
                N''' (an administrator binds it: mailq.BindApplication @AppName, @AccountName).')),
        -- Addresses and domains compare case-insensitively whatever the collation (LOWER, then binary).
        (31, 50161, N'FromAddress', IIF(n.AppName IS NOT NULL AND NOT EXISTS (
                SELECT 1
                FROM mailq.ApplicationFrom AS f
                CROSS APPLY (VALUES (LOWER(n.FromAddress) COLLATE Latin1_General_100_BIN2)) AS l(Addr)
                WHERE f.AppName = n.AppName AND (f.FromPattern = l.Addr
                    OR (LEFT(f.FromPattern, 1) = N'@' AND RIGHT(l.Addr, LEN(f.FromPattern)) = f.FromPattern))
            ), 1, 0), CONCAT(N'Application ''', n.AppName, N''' may not send as ''', n.FromAddress,
                N''' (an administrator binds it: mailq.BindApplication @AppName, @FromAddress = N''addr'' or ',
                N'N''@domain'').')),
        (32, 50117, N'Attachments', IIF(ISJSON(@Attachments) = 0 OR LEFT(LTRIM(@Attachments), 1) <> N'[', 1, 0),
            CONCAT(@P, N'Attachments must be a JSON array of {"FileName", "ContentType", "ContentBase64"} objects.'))
    ) AS v(RuleOrder, ErrorNumber, Field, Failed, Message)
    WHERE v.Failed = 1
    UNION ALL
    -- 8: a value over its size, 9: CR/LF in a header value; the first field by position.
    SELECT v.RuleOrder, v.Position, 0, v.ErrorNumber, v.Field,
        CONCAT(@P, v.Field, IIF(v.RuleOrder = 8,
            CONCAT(N' is ', LEN(v.Value), N' characters long; the limit is ', v.MaxLength, N'.'),
            N' contains CR or LF; header values must be one line (header injection is refused).'))
    FROM n
    CROSS APPLY (VALUES
        (8, 50103, 1, N'ToAddress', @ToAddress, 4000), (8, 50103, 2, N'CC', @CC, 4000),
        (8, 50103, 3, N'BCC', @BCC, 4000), (8, 50103, 4, N'Subject', @Subject, 900),
        (8, 50103, 5, N'FromAddress', @FromAddress, 320), (8, 50103, 6, N'FromName', @FromName, 200),
        (8, 50103, 7, N'ReplyTo', @ReplyTo, 320), (8, 50103, 8, N'AccountName', @AccountName, 128),
        (8, 50103, 9, N'AppName', @AppName, 128), (8, 50103, 10, N'IdempotencyKey', @IdempotencyKey, 200),
        (9, 50105, 1, N'Subject', @Subject, 0), (9, 50105, 2, N'FromName', @FromName, 0),
        (9, 50105, 3, N'ReplyTo', @ReplyTo, 0), (9, 50105, 4, N'FromAddress', @FromAddress, 0),
        (9, 50105, 5, N'IdempotencyKey', @IdempotencyKey, 0)
    ) AS v(RuleOrder, ErrorNumber, Position, Field, Value, MaxLength)
    WHERE IIF(v.RuleOrder = 8, IIF(LEN(v.Value) > v.MaxLength, 1, 0),
        IIF(v.Value COLLATE Latin1_General_100_BIN2 LIKE n.CrLf, 1, 0)) = 1
    UNION ALL
    -- 10: an address that is not one.
    SELECT 10, v.Position, 0, 50102, v.Field,
        CONCAT(@P, v.Field, N': address ''', LEFT(x.Address, 100), N''' ', x.Problem, N'.')
    FROM (VALUES
        (1, N'ToAddress', @ToAddress), (2, N'CC', @CC), (3, N'BCC', @BCC), (4, N'ReplyTo', @ReplyTo),
        (5, N'FromAddress', @FromAddress)
    ) AS v(Position, Field, Value)
    CROSS APPLY mailq.ParseAddressList(v.Value) AS x
    WHERE x.Problem IS NOT NULL
    UNION ALL
    -- 26: business headers (HeadersJson is NULL unless @Headers is a JSON object).
    SELECT 26, x.Position, 0, x.ErrorNumber, N'Headers', x.Message
    FROM (
        SELECT
            j.[key] AS Name, j.[value] AS Value, j.[type] AS JsonType,
            COUNT(*) OVER () AS Headers, COUNT(*) OVER (PARTITION BY UPPER(j.[key])) AS SameName, n.CrLf
        FROM n
        CROSS APPLY OPENJSON(n.HeadersJson) AS j
    ) AS h
    CROSS APPLY (VALUES
        (1, 50106, IIF(h.JsonType <> 1, 1, 0),
            CONCAT(@P, N'Headers: the value of ''', LEFT(h.Name, 80), N''' must be a JSON string.')),
        (2, 50106, IIF(h.Headers > 50, 1, 0), CONCAT(@P, N'Headers holds more than 50 headers.')),
        (3, 50106, IIF(h.SameName > 1, 1, 0), CONCAT(@P, N'Headers names one header twice.')),
        -- RFC 5322 field name: 1-76 printable US-ASCII characters except ':'.
        (4, 50107, IIF(LEN(h.Name) NOT BETWEEN 1 AND 76
                OR h.Name COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-9;-~]%', 1, 0),
            CONCAT(@P, N'Headers: ''', LEFT(h.Name, 80), N''' is not a valid header name ',
                N'(1-76 printable ASCII characters, no space or colon).')),
        (5, 50108, IIF(UPPER(h.Name) IN (
                N'FROM', N'TO', N'CC', N'BCC', N'SUBJECT', N'MESSAGE-ID', N'DATE', N'REPLY-TO', N'SENDER',
                N'RETURN-PATH', N'MIME-VERSION', N'CONTENT-TYPE', N'CONTENT-TRANSFER-ENCODING',
                N'CONTENT-DISPOSITION'
            ), 1, 0),
            CONCAT(@P, N'Headers: ''', LEFT(h.Name, 80), N''' is set by mailq-db and cannot be overridden.')),
        (6, 50105, IIF(h.Value COLLATE Latin1_General_100_BIN2 LIKE h.CrLf, 1, 0), CONCAT(@P,
            N'Headers: the value of ''', LEFT(h.Name, 80), N''' contains CR or LF (header injection is refused).')),
        (7, 50103, IIF(LEN(h.Value) > 900, 1, 0),
            CONCAT(@P, N'Headers: the value of ''', LEFT(h.Name, 80), N''' is longer than 900 characters.'))
    ) AS x(Position, ErrorNumber, Failed, Message)
    WHERE x.Failed = 1
    UNION ALL
    -- 33: attachments (mailq.MailAttachmentList reads a JSON array only and decodes nothing).
    SELECT 33, x.Position, t.AttachmentNo, x.ErrorNumber, N'Attachments', x.Message
    FROM (
        SELECT
            a.AttachmentNo, a.IsObject, a.FileName, a.ContentType, a.ContentBase64, a.Generator, a.GeneratorArgs,
            a.GeneratorArgsText, a.Base64Ok, a.Bytes, COUNT(*) OVER () AS Files, SUM(a.Bytes) OVER () AS TotalBytes
        FROM mailq.MailAttachmentList(@Attachments) AS a
    ) AS t
    CROSS APPLY (VALUES
        (1, 50117, IIF(t.IsObject = 0 OR (t.ContentBase64 IS NULL AND t.Generator IS NULL), 1, 0),
            CONCAT(@P, N'Attachments: every element must be an object with FileName and ContentBase64.')),
        (2, 50117, IIF(t.ContentBase64 IS NOT NULL AND t.Base64Ok = 0, 1, 0),
            CONCAT(@P, N'Attachments: ContentBase64 of attachment ', t.AttachmentNo,
                N' must be base64 text (A-Z, a-z, 0-9, +, /, ''='' padding, no line breaks).')),
        (3, 50286, IIF(t.Generator IS NOT NULL AND (t.ContentBase64 IS NOT NULL OR t.GeneratorArgsText IS NOT NULL
                OR LEFT(LTRIM(t.GeneratorArgs), 1) <> N'{' OR LEN(t.Generator) NOT BETWEEN 1 AND 128
                OR t.Generator COLLATE Latin1_General_100_BIN2 LIKE N'%[^A-Za-z0-9._-]%'), 1, 0),
            CONCAT(@P, N'Attachments: attachment ', t.AttachmentNo, N' (''', LEFT(t.FileName, 100), N'''): ', CASE
                WHEN t.ContentBase64 IS NOT NULL THEN N'give ContentBase64 or Generator, not both.'
                WHEN t.GeneratorArgsText IS NOT NULL OR LEFT(LTRIM(t.GeneratorArgs), 1) <> N'{'
                    THEN N'Arguments must be a JSON object.'
                ELSE N'Generator must be 1-128 characters of A-Z a-z 0-9 . _ - (an entry point name).'
            END)),
        (4, 50112, IIF(t.Files > 10, 1, 0), CONCAT(@P, N'Attachments holds more than 10 attachments.')),
        (5, 50113, IIF(NULLIF(LTRIM(RTRIM(t.FileName)), N'') IS NULL OR t.FileName LIKE N'%[/\:]%'
                OR t.FileName IN (N'.', N'..') OR LEN(t.FileName) > 255
                OR t.FileName COLLATE Latin1_General_100_BIN2
                LIKE N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%', 1, 0),
            CONCAT(@P, N'Attachments: file name ''', LEFT(t.FileName, 100),
                N''' must be a bare file name (not empty, no path, no control characters, <= 255 characters).')),
        (6, 50117, IIF(t.ContentType NOT LIKE N'_%/_%' OR LEN(t.ContentType) > 255
                OR t.ContentType COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(13) + NCHAR(10) + N']%', 1, 0),
            CONCAT(@P, N'Attachments: content type of ''', LEFT(t.FileName, 100), N''' must look like type/subtype.')),
        (7, 50112, IIF(t.Bytes > 10485760, 1, 0), CONCAT(@P, N'Attachments: ''', LEFT(t.FileName, 100),
            N''' is ', t.Bytes, N' bytes; the limit is 10485760 (10 MiB) per attachment.')),
        (8, 50112, IIF(t.TotalBytes > 26214400, 1, 0),
            CONCAT(@P, N'Attachments total more than 26214400 bytes (25 MiB) per mail.'))
    ) AS x(Position, ErrorNumber, Failed, Message)
    WHERE x.Failed = 1
),

firstproblem AS (
    SELECT TOP (1) p.ErrorNumber, p.Field, p.Message FROM problems AS p ORDER BY p.RuleOrder, p.Position, p.Item
)

SELECT
    n.Subject, n.Body, n.BodyFormat, n.FromAddress, n.FromName, n.ReplyTo, n.AccountName, n.AppName,
    n.Priority, n.DueUtc, n.MaxAttempts, n.RunMode, n.TemplateModel,
    RTRIM(@IdempotencyKey) COLLATE Latin1_General_100_BIN2 AS KeyText,
    -- A Message-ID is ASCII and fits its column: another domain gets a neutral one.
    IIF(d.Domain COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-~]%' OR LEN(d.Domain) > 200, N'mailq-db.invalid', d.Domain)
        AS Domain,
    -- Normalized: neither a default's spelling nor the path (single, JSON, TVP) changes it.
    HASHBYTES('SHA2_256', (
        SELECT
            @ToAddress AS ToAddress, @CC AS CC, @BCC AS BCC, n.Subject, n.Body, n.BodyFormat,
            @TextBody AS TextBody, n.FromAddress, n.FromName, n.ReplyTo, n.AccountName, n.AppName, n.Priority,
            @DateToProcess AS DateToProcess, @ExpiresAtUtc AS ExpiresAtUtc, n.MaxAttempts, n.RunMode,
            @TemplateName AS TemplateName, @TemplateVersion AS TemplateVersion, n.TemplateModel,
            (
                SELECT j.[key] AS Name, j.[value] AS Value FROM OPENJSON(n.HeadersJson) AS j
                ORDER BY j.[key] FOR JSON PATH
            ) AS Headers,
            (
                SELECT
                    LTRIM(RTRIM(t.FileName)) AS FileName,
                    COALESCE(t.ContentType, N'application/octet-stream') AS ContentType,
                    t.ContentBase64, t.Generator, t.GeneratorArgs
                FROM mailq.MailAttachmentList(@Attachments) AS t
                ORDER BY t.AttachmentNo FOR JSON PATH
            ) AS Attachments
        FOR JSON PATH, WITHOUT_ARRAY_WRAPPER, INCLUDE_NULL_VALUES
    )) AS ContentHash,
    r.ErrorNumber, r.Field, r.Message
FROM n
CROSS APPLY (VALUES (SUBSTRING(n.FromAddress, CHARINDEX(N'@', n.FromAddress) + 1, 320))) AS d(Domain)
LEFT JOIN firstproblem AS r ON 1 = 1;
