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
Transaction: validation first (XACT_ABORT as the caller has it); then the enqueue and
             its DbMailItem row in one transaction, its own or the caller's.
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
    DECLARE @Msg NVARCHAR(2048), @rc INT, @ProfileID INT, @FromList NVARCHAR(400);
    DECLARE @Hold DATETIME2(3) = '9000-01-01T00:00:00';
    SET @mailitem_id = NULL;
    SET @mailq_mail_id = NULL;
    SET @query = NULLIF(@query, N'');
    -- 1. Profile: the named one if the caller may use it, else the user's default,
    --    a role's, the public one.  No EXECUTE AS: USER_NAME() is the caller.
    IF @profile_name IS NOT NULL
    BEGIN
        SELECT @ProfileID = p.ProfileID FROM mailq.DbMailProfile AS p WHERE p.ProfileName = @profile_name;
        IF @ProfileID IS NULL
            OR (
                COALESCE(IS_MEMBER(N'db_owner'), 0) = 0
                AND NOT EXISTS (
                    SELECT 1
                    FROM mailq.DbMailPrincipalProfile AS pp
                    WHERE
                        pp.ProfileID = @ProfileID
                        AND (pp.PrincipalName IN (N'public', USER_NAME()) OR IS_MEMBER(pp.PrincipalName) = 1)
                )
            )
        BEGIN
            RAISERROR (14607, 16, 1, 'profile');
            RETURN 1;
        END;
    END;
    ELSE
    BEGIN
        SELECT TOP (1) @ProfileID = pp.ProfileID
        FROM mailq.DbMailPrincipalProfile AS pp
        WHERE pp.IsDefault = 1 AND (pp.PrincipalName IN (N'public', USER_NAME()) OR IS_MEMBER(pp.PrincipalName) = 1)
        ORDER BY CASE pp.PrincipalName WHEN USER_NAME() THEN 0 WHEN N'public' THEN 2 ELSE 1 END, pp.PrincipalName;
        IF @ProfileID IS NULL
        BEGIN
            RAISERROR (14636, 16, 1);
            RETURN 1;
        END;
    END;
    -- 2. msdb's checks, in msdb's order and with its numbers and return codes.
    SET @rc = CASE
        WHEN @attach_query_result_as_file IS NULL THEN 2
        WHEN @exclude_query_output IS NULL THEN 3
        WHEN @query_result_header IS NULL THEN 4
        WHEN @query_result_separator IS NULL OR DATALENGTH(@query_result_separator) = 0 THEN 5
        WHEN @append_query_error IS NULL THEN 6
    END;
    IF @rc IS NOT NULL
    BEGIN
        SET @Msg = CHOOSE(@rc - 1, N'attach_query_result_as_file', N'exclude_query_output',
            N'query_result_header', N'query_result_separator', N'append_query_error');
        RAISERROR (14618, 16, 1, @Msg);
        RETURN @rc;
    END;
    SET @body_format = UPPER(COALESCE(@body_format, 'TEXT'));
    IF @body_format NOT IN ('TEXT', 'HTML')
    BEGIN
        RAISERROR (14626, 16, 1, @body_format);
        RETURN 13;
    END;
    IF @importance IS NULL
    BEGIN
        RAISERROR (14618, 16, 1, N'importance');
        RETURN 15;
    END;
    SET @importance = UPPER(@importance);
    IF @importance NOT IN ('LOW', 'NORMAL', 'HIGH')
    BEGIN
        RAISERROR (14622, 16, 1, @importance);
        RETURN 16;
    END;
    IF @sensitivity IS NULL
    BEGIN
        RAISERROR (14618, 16, 1, N'sensitivity');
        RETURN 17;
    END;
    SET @sensitivity = UPPER(@sensitivity);
    IF @sensitivity NOT IN ('NORMAL', 'PERSONAL', 'PRIVATE', 'CONFIDENTIAL')
    BEGIN
        RAISERROR (14623, 16, 1, @sensitivity);
        RETURN 18;
    END;
    IF COALESCE(LEN(@body), 0) = 0 AND @query IS NULL AND COALESCE(LEN(@file_attachments), 0) = 0
        AND COALESCE(LEN(@subject), 0) = 0
    BEGIN
        RAISERROR (14624, 16, 1, N'@body, @query, @file_attachments, @subject');
        RETURN 19;
    END;
    IF COALESCE(LEN(@subject), 0) = 0 SET @subject = N'SQL Server Message';
    IF COALESCE(LEN(@recipients), 0) = 0 AND COALESCE(LEN(@copy_recipients), 0) = 0
        AND COALESCE(LEN(@blind_copy_recipients), 0) = 0
    BEGIN
        RAISERROR (14624, 16, 1, N'@recipients, @copy_recipients, @blind_copy_recipients');
        RETURN 20;
    END;
    -- msdb refuses a comma outside double quotes; quoted lists go to the address rules.
    SELECT TOP (1) @Msg = v.ParamName, @FromList = LEFT(v.Value, 400)
    FROM (
        VALUES (1, N'@recipients', @recipients), (2, N'@copy_recipients', @copy_recipients),
        (3, N'@blind_copy_recipients', @blind_copy_recipients), (4, N'@reply_to', @reply_to)
    ) AS v(Position, ParamName, Value)
    WHERE v.Value LIKE '%,%' AND CHARINDEX('"', v.Value) = 0
    ORDER BY v.Position;
    IF @FromList IS NOT NULL
    BEGIN
        RAISERROR (14613, 16, 1, @Msg, @FromList);
        RETURN 1;
    END;
    IF @query IS NULL AND @attach_query_result_as_file = 1
    BEGIN
        RAISERROR (14625, 16, 1);
        RETURN 21;
    END;
    SET @query_attachment_filename = NULLIF(LTRIM(RTRIM(@query_attachment_filename)), N'');
    IF @query IS NOT NULL AND @attach_query_result_as_file = 1
        AND (
            @query_attachment_filename LIKE N'%.exe' OR @query_attachment_filename LIKE N'%.dll'
            OR @query_attachment_filename LIKE N'%.vbs' OR @query_attachment_filename LIKE N'%.js'
        )
    BEGIN
        RAISERROR (14630, 16, 1, @query_attachment_filename, N'exe,dll,vbs,js');
        RETURN 2;
    END;
    IF @query IS NOT NULL AND @execute_query_database IS NOT NULL AND DB_ID(@execute_query_database) IS NULL
    BEGIN
        RAISERROR (14633, 16, 1, @execute_query_database);
        RETURN 1;
    END;
    -- 3. This package's refusals: RAISERROR (50000) and RETURN 50641-50652.
    SELECT TOP (1) @rc = r.ReturnCode, @Msg = r.Message
    FROM (
        SELECT 50641 AS ReturnCode, 1 AS Position,
            N'@file_attachments is not supported: the sender worker never reads the database server''s disk; '
            + N'send the content with mailq.EnqueueMail @Attachments, or a query''s result with @query.' AS Message
        WHERE COALESCE(LEN(@file_attachments), 0) > 0
        UNION ALL
        SELECT p.ReturnCode, 2, p.Message
        FROM mailq.DbMailAddressProblem(
            @recipients, @copy_recipients, @blind_copy_recipients, @from_address, @reply_to
        ) AS p
        UNION ALL
        SELECT 50645, 3, N'@body is limited to 2,000,000 characters here.' WHERE LEN(@body) > 2000000
        UNION ALL
        SELECT 50646, 4, N'@subject contains CR or LF; a subject is one line.'
        WHERE @subject LIKE N'%' + NCHAR(13) + N'%' OR @subject LIKE N'%' + NCHAR(10) + N'%'
        UNION ALL
        SELECT 50647, 5, CONCAT(N'@execute_query_database ''', @execute_query_database,
            N''': the query runs as your database user in this database (', DB_NAME(),
            N') only; use three-part names only where that user may (docs/database-mail.md).')
        WHERE @query IS NOT NULL AND DB_ID(@execute_query_database) <> DB_ID()
        UNION ALL
        SELECT 50648, 6, CONCAT(N'@query_result_width must be 10-32767; got ', @query_result_width, N'.')
        WHERE @query IS NOT NULL AND COALESCE(@query_result_width, 0) NOT BETWEEN 10 AND 32767
        UNION ALL
        SELECT 50649, 7, N'@query_result_no_padding and @query_no_truncate are mutually exclusive.'
        WHERE @query IS NOT NULL AND @query_result_no_padding = 1 AND @query_no_truncate = 1
        UNION ALL
        SELECT 50650, 8, CONCAT(N'@mailq_query_result_format must be TEXT, HTML or CSV; got ''',
            @mailq_query_result_format, N'''.')
        WHERE UPPER(COALESCE(@mailq_query_result_format, 'TEXT')) NOT IN ('TEXT', 'HTML', 'CSV')
        UNION ALL
        SELECT 50652, 9, N'@query_attachment_filename must be a file name of at most 255 characters, without / \ :'
        WHERE @query IS NOT NULL AND @attach_query_result_as_file = 1
            AND (LEN(@query_attachment_filename) > 255 OR @query_attachment_filename LIKE N'%[/\:]%')
    ) AS r
    ORDER BY r.Position;
    IF @rc IS NOT NULL
    BEGIN
        RAISERROR (N'%s', 16, 1, @Msg);
        RETURN @rc;
    END;
    -- Failover: the profile's first account not blocked (else the first).
    DECLARE @AccountName NVARCHAR(128);
    SELECT TOP (1) @AccountName = a.AccountName
    FROM mailq.DbMailProfileAccount AS pa
    INNER JOIN mailq.DbMailAccount AS da ON pa.AccountID = da.AccountID
    INNER JOIN mailq.SendingAccount AS a ON da.AccountName = a.AccountName
    WHERE pa.ProfileID = @ProfileID
    ORDER BY IIF(a.BlockedUntilUtc > SYSUTCDATETIME(), 1, 0), pa.SequenceNumber, pa.AccountID;
    IF @AccountName IS NULL
    BEGIN
        RAISERROR (N'The profile has no account (mailq.UpsertDbMailProfileAccount).', 16, 1);
        RETURN 50651;
    END;
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
