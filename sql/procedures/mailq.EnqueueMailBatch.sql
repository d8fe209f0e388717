/*
mailq.EnqueueMailBatch: queues up to 10,000 mails in one call, each with EnqueueMail's rules.
Parameters:  @Mails (JSON array of objects named like EnqueueMail's parameters) or @MailRows (READONLY),
             exactly one, at most 256 MB; @RejectInvalid BIT: 0 (default) all or nothing, 1 the valid rows.
Result sets: 1. RowNo, MailID, MessageID, Created (0: the key's mail); 2. rejected rows:
             RowNo, Field, ErrorNumber (EnqueueMail's, or 50223), Message.
Errors:      50220 a row invalid (row, field, rule); 50221 input shape; 50222 row count; 50224
             bad base64; 50225 key lock not granted in 10 s; 50226 over 256 MB.  Nothing written.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: set by the core.
Lock order:  the keys' application locks in binary key order, mailq.Suppression (shared, held),
             mailq.MailQueue, mailq.MailAttachment, mailq.MailEvent.
Example:     EXEC mailq.EnqueueMailBatch @Mails = N'[{"ToAddress": "a@example.com", "Body": "B"}]';
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMailBatch
    @Mails NVARCHAR(MAX) = NULL,
    @MailRows mailq.MailBatchRow READONLY,
    @RejectInvalid BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    DECLARE @Msg NVARCHAR(2048), @Rows BIGINT, @Bytes BIGINT;
    DECLARE @RowsGiven BIT = IIF(EXISTS (SELECT 1 FROM @MailRows), 1, 0);   -- an omitted TVP is empty
    IF (@Mails IS NULL AND @RowsGiven = 0) OR (@Mails IS NOT NULL AND @RowsGiven = 1)
        THROW 50221,
            N'Give the mails in exactly one of @Mails (a JSON array of objects) and @MailRows (mailq.MailBatchRow).',
            1;
    IF @Mails IS NOT NULL
    BEGIN
        SET @Bytes = DATALENGTH(@Mails);
        IF @Bytes <= 268435456
        BEGIN
            IF ISJSON(@Mails) = 0
                OR LEFT(LTRIM(TRANSLATE(LEFT(@Mails, 4000), NCHAR(9) + NCHAR(10) + NCHAR(13), N'   ')), 1) <> N'['
                THROW 50221,
                    N'@Mails must be a JSON array of objects, e.g. [{"ToAddress": "a@x.org", "Body": "B"}].', 1;
            SELECT TOP (1) @Msg = CONCAT(N'@Mails: element ', CAST(e.[key] AS INT) + 1, N' is not a JSON object.')
            FROM OPENJSON(@Mails) AS e
            WHERE e.[type] <> 5
            ORDER BY CAST(e.[key] AS INT);
            IF @Msg IS NOT NULL THROW 50221, @Msg, 1;
            SET @Rows = (SELECT COUNT_BIG(*) FROM OPENJSON(@Mails));
        END;
    END;
    ELSE
        SELECT
            @Rows = COUNT_BIG(*),
            @Bytes = SUM(
                CAST(COALESCE(DATALENGTH(r.Body), 0) AS BIGINT) + COALESCE(DATALENGTH(r.TextBody), 0)
                + COALESCE(DATALENGTH(r.Headers), 0) + COALESCE(DATALENGTH(r.Attachments), 0)
                + COALESCE(DATALENGTH(r.ToAddress), 0) + COALESCE(DATALENGTH(r.CC), 0)
                + COALESCE(DATALENGTH(r.BCC), 0) + COALESCE(DATALENGTH(r.Subject), 0)
                + COALESCE(DATALENGTH(r.TemplateModel), 0)
            )
        FROM @MailRows AS r;
    IF @Bytes > 268435456
    BEGIN
        SET @Msg = CONCAT(IIF(@Mails IS NULL, N'@MailRows', N'@Mails'), N' holds ', @Bytes,
            N' bytes of text; a batch takes at most 268435456 (256 MB): split it into smaller batches.');
        THROW 50226, @Msg, 1;
    END;
    IF @Rows NOT BETWEEN 1 AND 10000
    BEGIN
        SET @Msg = CONCAT(IIF(@Mails IS NULL, N'@MailRows', N'@Mails'), N' holds ', @Rows,
            N' mails; a batch takes 1-10000.');
        THROW 50222, @Msg, 1;
    END;
    -- WITH RECOMPILE: a plan for this batch's rows; the cached plan stays the single call's.
    EXEC mailq.EnqueueMailRows @Rows = @MailRows, @Mails = @Mails, @RejectInvalid = @RejectInvalid WITH RECOMPILE;
END;
