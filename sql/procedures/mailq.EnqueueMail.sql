/*
mailq.EnqueueMail: validates and queues one mail (a key queued with the same content returns its mail).
Parameters:  a recipient in @ToAddress, @CC or @BCC; @Subject, @Body unless @TemplateName;
             the rest optional, NULL = the default (docs/enqueue.md).
Outputs:     @MailID, @MessageID, @Created (0: the key's mail); no result set (triggers may call it).
Errors:      50101-50121, 50160, 50161, 50168, 50240, 50280-50286, 50500, 50600 (the rule broken,
             docs/errors.md); 50116 key reused with other content; 50162 key lock not granted in 10 s.
Transaction: its own if none is open, else the caller's (also distributed); an error dooms it.
Isolation:   READ COMMITTED and the filtered-index SET options, set by mailq.EnqueueMailRows.
Lock order:  the key's application lock, mailq.Suppression (shared, held), mailq.MailQueue, MailAttachment, MailEvent.
Example:     EXEC mailq.EnqueueMail @ToAddress = N'ops@example.com', @Subject = N'Report', @Body = N'Done.';
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMail
    @ToAddress NVARCHAR(MAX) = NULL,
    @Subject NVARCHAR(MAX) = NULL,
    @Body NVARCHAR(MAX) = NULL,
    @BodyFormat NVARCHAR(20) = NULL,
    @TextBody NVARCHAR(MAX) = NULL,
    @CC NVARCHAR(MAX) = NULL,
    @BCC NVARCHAR(MAX) = NULL,
    @FromAddress NVARCHAR(MAX) = NULL,
    @FromName NVARCHAR(MAX) = NULL,
    @ReplyTo NVARCHAR(MAX) = NULL,
    @Headers NVARCHAR(MAX) = NULL,
    @AccountName NVARCHAR(4000) = NULL,
    @AppName NVARCHAR(4000) = NULL,
    @Priority INT = NULL,
    @DateToProcess DATETIME2(3) = NULL,
    @ExpiresAtUtc DATETIME2(3) = NULL,
    @MaxAttempts INT = NULL,
    @IdempotencyKey NVARCHAR(4000) = NULL,
    @Attachments NVARCHAR(MAX) = NULL,
    @MailID BIGINT = NULL OUTPUT,
    @MessageID NVARCHAR(255) = NULL OUTPUT,
    @Created BIT = NULL OUTPUT,
    @RunMode NVARCHAR(4000) = NULL,
    @TemplateName NVARCHAR(4000) = NULL,
    @TemplateVersion INT = NULL,
    @TemplateModel NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    EXEC mailq.EnqueueMailRows
        @Single = 1,
        @ToAddress = @ToAddress, @Subject = @Subject, @Body = @Body, @BodyFormat = @BodyFormat,
        @TextBody = @TextBody, @CC = @CC, @BCC = @BCC, @FromAddress = @FromAddress, @FromName = @FromName,
        @ReplyTo = @ReplyTo, @Headers = @Headers, @AccountName = @AccountName, @AppName = @AppName,
        @Priority = @Priority, @DateToProcess = @DateToProcess, @ExpiresAtUtc = @ExpiresAtUtc,
        @MaxAttempts = @MaxAttempts, @IdempotencyKey = @IdempotencyKey, @Attachments = @Attachments,
        @RunMode = @RunMode, @TemplateName = @TemplateName, @TemplateVersion = @TemplateVersion,
        @TemplateModel = @TemplateModel,
        @MailID = @MailID OUTPUT, @MessageID = @MessageID OUTPUT, @Created = @Created OUTPUT;
END;
