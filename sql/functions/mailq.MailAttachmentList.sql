/*
mailq.MailAttachmentList: the attachments of one mail from EnqueueMail's
@Attachments text, never raising an error (inline).
Parameters:  @Attachments NVARCHAR(MAX): a JSON array; anything else gives no rows
Returns:     per element: AttachmentNo (from 1), IsObject, FileName, ContentType,
             ContentBase64, Generator, GeneratorArgs (object or array),
             GeneratorArgsText (scalar), Base64Ok (canonical base64: A-Z a-z 0-9
             + /, length a multiple of 4, '=' only as 1-2 final characters), Bytes.
No error:    OPENJSON only meets text IIF proved to be JSON (13609 would fail a
             whole batch); nothing is decoded here (the core decodes Base64Ok text).
Example:     SELECT a.Bytes FROM mailq.MailAttachmentList(N'[{"FileName": "a", "ContentBase64": "YQ=="}]') AS a;
*/
CREATE OR ALTER FUNCTION mailq.MailAttachmentList(@Attachments NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN
SELECT
    CAST(e.[key] AS INT) + 1 AS AttachmentNo,
    IIF(e.[type] = 5, 1, 0) AS IsObject,
    f.FileName,
    f.ContentType,
    f.ContentBase64,
    f.Generator,
    f.GeneratorArgs,
    f.GeneratorArgsText,
    IIF(
        b.Chars % 4 = 0
        AND f.ContentBase64 COLLATE Latin1_General_100_BIN2 NOT LIKE N'%[^A-Za-z0-9+/=]%'
        AND (b.Pad = 0 OR (b.Pad >= b.Chars - 1 AND SUBSTRING(f.ContentBase64, b.Pad, 2) IN (N'=', N'=='))),
        1, 0
    ) AS Base64Ok,
    b.Chars / 4 * 3 - IIF(b.Pad = 0, 0, b.Chars - b.Pad + 1) AS Bytes
FROM OPENJSON(IIF(ISJSON(@Attachments) = 1 AND LEFT(LTRIM(@Attachments), 1) = N'[', @Attachments, NULL)) AS e
-- IIF: a scalar element is not JSON text (OPENJSON would raise 13609).
OUTER APPLY OPENJSON (IIF(e.[type] = 5, e.[value], NULL))
    WITH (
        FileName NVARCHAR(4000) '$.FileName',
        ContentType NVARCHAR(4000) '$.ContentType',
        ContentBase64 NVARCHAR(MAX) '$.ContentBase64',
        Generator NVARCHAR(4000) '$.Generator',
        -- AS JSON: an object or array value (NULL for a scalar)
        GeneratorArgs NVARCHAR(MAX) '$.Arguments' AS JSON,
        GeneratorArgsText NVARCHAR(MAX) '$.Arguments'
    ) AS f
-- DATALENGTH, not LEN: trailing spaces count (and are not base64).
CROSS APPLY (
    VALUES (CAST(DATALENGTH(f.ContentBase64) / 2 AS BIGINT), CAST(CHARINDEX(N'=', f.ContentBase64) AS BIGINT))
) AS b(Chars, Pad);
