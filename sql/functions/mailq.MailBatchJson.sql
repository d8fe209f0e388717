/*
mailq.MailBatchJson: EnqueueMailBatch's @Mails (a JSON array of objects) as rows of
mailq.MailBatchRow's columns, never raising an error (inline).
Parameters:  @Mails NVARCHAR(MAX); NULL or not JSON gives no rows
Returns:     RowNo (position + 1), the fields as MailBatchRow types them, and
             InputField/InputMessage: a field unknown or of the wrong JSON type
             (rule 50223), else NULL.  Fields are read as text and converted with
             TRY_CONVERT; Headers, Attachments, TemplateModel may be JSON or a
             string; times are ISO 8601, an offset converted to UTC.
Example:     SELECT j.RowNo, j.InputMessage FROM mailq.MailBatchJson(N'[{"Priority": "9"}]') AS j;
*/
CREATE OR ALTER FUNCTION mailq.MailBatchJson(@Mails NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN
SELECT
    CAST(e.[key] AS INT) + 1 AS RowNo,
    f.ToAddress, f.Subject, f.Body, f.BodyFormat, f.TextBody, f.CC, f.BCC, f.FromAddress, f.FromName,
    f.ReplyTo, COALESCE(f.HeadersObject, f.HeadersText) AS Headers, f.AccountName, f.AppName,
    TRY_CONVERT(INT, f.Priority) AS Priority,
    CONVERT(DATETIME2(3), SWITCHOFFSET(IIF(YEAR(t.Due) BETWEEN 2 AND 9998, t.Due, NULL), N'+00:00')) AS DateToProcess,
    CONVERT(DATETIME2(3), SWITCHOFFSET(IIF(YEAR(t.Expires) BETWEEN 2 AND 9998, t.Expires, NULL), N'+00:00'))
        AS ExpiresAtUtc,
    TRY_CONVERT(INT, f.MaxAttempts) AS MaxAttempts, f.IdempotencyKey,
    COALESCE(f.AttachmentsArray, f.AttachmentsText) AS Attachments, f.RunMode, f.TemplateName,
    TRY_CONVERT(INT, f.TemplateVersion) AS TemplateVersion,
    COALESCE(f.TemplateModelObject, f.TemplateModelText) AS TemplateModel,
    LEFT(p.Field, 128) AS InputField, p.Message AS InputMessage
FROM OPENJSON(IIF(ISJSON(@Mails) = 1, @Mails, NULL)) AS e
-- IIF: an element that is not an object is not JSON text for OPENJSON (13609).
CROSS APPLY OPENJSON (IIF(e.[type] = 5, e.[value], NULL))
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
        AttachmentsArray NVARCHAR(MAX) '$.Attachments' AS JSON, AttachmentsText NVARCHAR(MAX) '$.Attachments',
        RunMode NVARCHAR(4000) '$.RunMode', TemplateName NVARCHAR(4000) '$.TemplateName',
        TemplateVersion NVARCHAR(MAX) '$.TemplateVersion',
        TemplateModelObject NVARCHAR(MAX) '$.TemplateModel' AS JSON,
        TemplateModelText NVARCHAR(MAX) '$.TemplateModel'
    ) AS f
CROSS APPLY (
    VALUES (TRY_CONVERT(DATETIMEOFFSET(3), f.DateToProcess, 127), TRY_CONVERT(DATETIMEOFFSET(3), f.ExpiresAtUtc, 127))
) AS t(Due, Expires)
OUTER APPLY (
    SELECT TOP (1) k.[key] AS Field, v.Message
    FROM OPENJSON(IIF(e.[type] = 5, e.[value], NULL)) AS k
    CROSS APPLY (
        SELECT CASE
            WHEN k.[key] COLLATE Latin1_General_100_BIN2 NOT IN (
                N'ToAddress', N'Subject', N'Body', N'BodyFormat', N'TextBody', N'CC', N'BCC', N'FromAddress',
                N'FromName', N'ReplyTo', N'Headers', N'AccountName', N'AppName', N'Priority', N'DateToProcess',
                N'ExpiresAtUtc', N'MaxAttempts', N'IdempotencyKey', N'Attachments', N'RunMode', N'TemplateName',
                N'TemplateVersion', N'TemplateModel'
            )
                THEN CONCAT(N'''', LEFT(k.[key], 80), N''' is not a field of a mail (names are case-sensitive).')
            WHEN k.[type] = 0 OR k.[key] IN (N'Headers', N'Attachments', N'TemplateModel') THEN NULL
            WHEN k.[key] IN (N'Priority', N'MaxAttempts', N'TemplateVersion')
                THEN IIF(k.[type] = 2 AND TRY_CONVERT(INT, k.[value]) IS NOT NULL, NULL,
                    CONCAT(N'''', k.[key], N''' must be a JSON number that is an integer (not a string).'))
            WHEN k.[key] IN (N'DateToProcess', N'ExpiresAtUtc')
                THEN IIF(k.[type] = 1
                    AND YEAR(TRY_CONVERT(DATETIMEOFFSET(3), k.[value], 127)) BETWEEN 2 AND 9998, NULL,
                    CONCAT(N'''', k.[key], N''' must be an ISO 8601 time, e.g. "2030-01-01T08:00:00Z" ',
                        N'(an offset such as +02:00 is converted to UTC).'))
            WHEN k.[type] <> 1 THEN CONCAT(N'''', k.[key], N''' must be a JSON string.')
        END AS Message
    ) AS v
    WHERE v.Message IS NOT NULL
) AS p;
