/*
mailq.SendDbMail: msdb.dbo.sp_send_dbmail on this queue (docs/database-mail.md):
msdb's parameters in its declaration order, then the @mailq_ extensions.  Reference:
https://learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sp-send-dbmail-transact-sql
Parameters:  as sp_send_dbmail's; @file_attachments is refused; @query runs later
             as the caller's database user, in this database (mailq-db dbmail-runner)
             @mailq_query_result_format 'TEXT' (default) | 'HTML' | 'CSV'
             @mailq_mail_id BIGINT OUTPUT; @mailitem_id INT OUTPUT (sysmail_* key)
Result:      no result set; PRINT 'Mail (Id: n) queued.' unless @exclude_query_output = 1
Errors:      as msdb: RAISERROR severity 16 and RETURN n, nothing written, the caller's
             transaction goes on: 14636/14607 rc 1, 14618 rc 2-6, 15, 17, 14626 rc 13,
             14622 rc 16, 14623 rc 18, 14624 rc 19-20, 14613 rc 1, 14625 rc 21,
             14630 rc 2, 14633 rc 1; this package's: RAISERROR 50000 and RETURN
             50641-50652 (docs/errors.md).  THROWn under XACT_ABORT: EnqueueMail's
             errors not checked here (50500, 50160/50161/50168, 50114, 50600, deadlock).
Transaction: validation first (mailq.CheckDbMailRequest, XACT_ABORT as the caller has
             it); then the enqueue and its DbMailItem row in one transaction, its own
             or the caller's.
Isolation:   the caller's (EnqueueMail sets its own).
Lock order:  (via EnqueueMail) mailq.Suppression, mailq.MailQueue,
             mailq.MailAttachment, then mailq.DbMailItem.
Example:     DECLARE @rc INT;
             EXEC @rc = mailq.SendDbMail @recipients = 'dba@example.com', @subject = N'Backups';
*/
CREATE OR ALTER PROCEDURE mailq.SendDbMail
    @profile_name SYSNAME = NULL,
    @recipients VARCHAR(MAX) = NULL,
    @copy_recipients VARCHAR(MAX) = NULL,
    @blind_copy_recipients VARCHAR(MAX) = NULL,
    @subject NVARCHAR(255) = NULL,
    @body NVARCHAR(MAX) = NULL,
    @body_format VARCHAR(20) = NULL,
    @importance VARCHAR(6) = 'NORMAL',
    @sensitivity VARCHAR(12) = 'NORMAL',
    @file_attachments NVARCHAR(MAX) = NULL,
    @query NVARCHAR(MAX) = NULL,
    @execute_query_database SYSNAME = NULL,
    @attach_query_result_as_file BIT = 0,
    @query_attachment_filename NVARCHAR(260) = NULL,
    @query_result_header BIT = 1,
    @query_result_width INT = 256,
    @query_result_separator CHAR(1) = ' ',
    @exclude_query_output BIT = 0,
    @append_query_error BIT = 0,
    @query_no_truncate BIT = 0,
    @query_result_no_padding BIT = 0,
    @mailitem_id INT = NULL OUTPUT,
    @from_address VARCHAR(MAX) = NULL,
    @reply_to VARCHAR(MAX) = NULL,
    @mailq_query_result_format VARCHAR(4) = 'TEXT',
    @mailq_mail_id BIGINT = NULL OUTPUT
AS
BEGIN
    -- XACT_ABORT as the caller has it until the enqueue: checks RAISERROR and RETURN.
    SET NOCOUNT ON;
    DECLARE @Msg NVARCHAR(2048), @rc INT, @ProfileID INT;
    DECLARE @Hold DATETIME2(3) = '9000-01-01T00:00:00';
    SET @mailitem_id = NULL;
    SET @mailq_mail_id = NULL;
    SET @query = NULLIF(@query, N'');
    -- 1.-3. The checks: a refusal has RAISEd its error and returns its code, nothing written.
    DECLARE @AccountName NVARCHAR(128);
    EXEC @rc = mailq.CheckDbMailRequest
        @profile_name = @profile_name,
        @recipients = @recipients,
        @copy_recipients = @copy_recipients,
        @blind_copy_recipients = @blind_copy_recipients,
        @subject = @subject OUTPUT,
        @body = @body,
        @body_format = @body_format OUTPUT,
        @importance = @importance OUTPUT,
        @sensitivity = @sensitivity OUTPUT,
        @file_attachments = @file_attachments,
        @query = @query,
        @execute_query_database = @execute_query_database,
        @attach_query_result_as_file = @attach_query_result_as_file,
        @query_attachment_filename = @query_attachment_filename OUTPUT,
        @query_result_header = @query_result_header,
        @query_result_width = @query_result_width,
        @query_result_separator = @query_result_separator,
        @exclude_query_output = @exclude_query_output,
        @append_query_error = @append_query_error,
        @query_no_truncate = @query_no_truncate,
        @query_result_no_padding = @query_result_no_padding,
        @from_address = @from_address,
        @reply_to = @reply_to,
        @mailq_query_result_format = @mailq_query_result_format,
        @ProfileID = @ProfileID OUTPUT,
        @AccountName = @AccountName OUTPUT;
    -- NULL: the checks did not finish (an error ended them); refuse as well.
    IF @rc IS NULL OR @rc <> 0 RETURN COALESCE(@rc, 1);
    -- 4. The mail; importance and sensitivity become the headers System.Net.Mail writes.
    DECLARE @FromAddress NVARCHAR(MAX) = @from_address, @FromName NVARCHAR(MAX);
    SELECT @FromAddress = a.Address, @FromName = a.DisplayName
    FROM mailq.ParseAddressList(@from_address) AS a;
    DECLARE @Headers NVARCHAR(MAX) = (
        SELECT N'{' + STRING_AGG(CONCAT(N'"', h.HeaderName, N'": "', h.HeaderValue, N'"'), N', ') + N'}'
        FROM (
            VALUES
            ('HIGH', NULL, N'X-Priority', N'1'), ('HIGH', NULL, N'Priority', N'urgent'),
            ('HIGH', NULL, N'Importance', N'high'), ('LOW', NULL, N'X-Priority', N'5'),
            ('LOW', NULL, N'Priority', N'non-urgent'), ('LOW', NULL, N'Importance', N'low'),
            (NULL, 'PERSONAL', N'Sensitivity', N'Personal'), (NULL, 'PRIVATE', N'Sensitivity', N'Private'),
            (NULL, 'CONFIDENTIAL', N'Sensitivity', N'Company-Confidential')
        ) AS h(Importance, Sensitivity, HeaderName, HeaderValue)
        WHERE h.Importance = @importance OR h.Sensitivity = @sensitivity
    );
    -- Mail with a query waits until mailq.CompleteDbMailQuery makes it due.
    DECLARE @Due DATETIME2(3) = IIF(@query IS NULL, NULL, @Hold);
    DECLARE @ToAddress NVARCHAR(MAX) = NULLIF(LTRIM(RTRIM(@recipients)), '');
    DECLARE @MailBody NVARCHAR(MAX) = COALESCE(@body, N'');
    DECLARE @EnqueueFormat NVARCHAR(20) = IIF(@body_format = 'HTML', N'Html', N'Text');
    DECLARE @MailID BIGINT, @ItemID INT;
    SET XACT_ABORT ON;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.EnqueueMail
            @ToAddress = @ToAddress,
            @CC = @copy_recipients,
            @BCC = @blind_copy_recipients,
            @Subject = @subject,
            @Body = @MailBody,
            @BodyFormat = @EnqueueFormat,
            @FromAddress = @FromAddress,
            @FromName = @FromName,
            @ReplyTo = @reply_to,
            @Headers = @Headers,
            @AccountName = @AccountName,
            @DateToProcess = @Due,
            @MailID = @MailID OUTPUT;
        INSERT INTO mailq.DbMailItem (
            MailID, ProfileID, Importance, Sensitivity, Query, ExecuteQueryDatabase,
            AttachQueryResultAsFile, QueryAttachmentFilename, QueryResultHeader, QueryResultWidth,
            QueryResultSeparator, ExcludeQueryOutput, AppendQueryError, QueryNoTruncate, QueryResultNoPadding,
            QueryResultFormat, SendRequestUser, SendRequestDate, RequestUser, RequestUserSid,
            QueryState, QueryDueAtUtc
        )
        VALUES (
            @MailID, @ProfileID, @importance, @sensitivity, @query, IIF(@query IS NULL, NULL, DB_NAME()),
            @attach_query_result_as_file, @query_attachment_filename, @query_result_header,
            COALESCE(@query_result_width, 256), @query_result_separator, @exclude_query_output,
            @append_query_error, COALESCE(@query_no_truncate, 0), COALESCE(@query_result_no_padding, 0),
            UPPER(COALESCE(@mailq_query_result_format, 'TEXT')),
            COALESCE(SUSER_SNAME(), USER_NAME()), CAST(SYSDATETIME() AS DATETIME), USER_NAME(), USER_SID(),
            IIF(@query IS NULL, NULL, N'Pending'), IIF(@query IS NULL, NULL, SYSUTCDATETIME())
        );
        SET @ItemID = SCOPE_IDENTITY();
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SET @mailitem_id = @ItemID;
    SET @mailq_mail_id = @MailID;
    IF @exclude_query_output = 0
    BEGIN
        SET @Msg = COALESCE(FORMATMESSAGE(14635, @ItemID), CONCAT(N'Mail (Id: ', @ItemID, N') queued.'));
        PRINT @Msg;
    END;
    RETURN 0;
END;
