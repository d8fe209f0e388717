/*
mailq.SendDbMail: msdb.dbo.sp_send_dbmail's interface on this queue.  Switching
a caller is a one-word change: EXEC msdb.dbo.sp_send_dbmail ... becomes
EXEC mailq.SendDbMail ... with the same named parameters.
Reference:   parameters, order, types, defaults and meanings follow Microsoft's
             page (sp_send_dbmail, Transact-SQL):
https://learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sp-send-dbmail-transact-sql
             (the order of its Syntax section; msdb's own procedure declares
             @from_address and @reply_to last, so name every parameter).
             VARCHAR parameters keep the documented types: like Database Mail,
             a non-ASCII address passed there is lost to the code page; pass
             such mail through mailq.EnqueueMail.
Parameters:  @profile_name   a profile (mailq.UpsertDbMailProfile); NULL: the
                             caller's default profile, else a default profile
                             of a role the caller is in, else the default
                             public profile
             @recipients, @copy_recipients, @blind_copy_recipients
                             ';'-separated addresses; @recipients is required
                             here (the queue sends no mail without a To)
             @from_address   'address' or 'Name <address>'; default: the account's
             @reply_to       one address
             @subject        default N'SQL Server Message'
             @body           default empty
             @body_format    TEXT (default) or HTML
             @importance     Low, Normal (default), High: the headers
                             Database Mail's System.Net.Mail writes
                             (High: X-Priority: 1, Priority: urgent,
                             Importance: high; Low: X-Priority: 5,
                             Priority: non-urgent, Importance: low; Normal: none)
             @sensitivity    Normal (default), Personal, Private, Confidential:
                             header Sensitivity: Personal | Private |
                             Company-Confidential (RFC 2156); Normal: none
             @file_attachments  refused (50191): the sender worker runs on
                             another machine and never reads this server's disk
             @query ... @query_result_no_padding: see mailq.RenderDbMailQuery
                             (run at call time, as the caller, in
                             @execute_query_database, default the current one)
             @attach_query_result_as_file 1: the result is an attachment named
                             @query_attachment_filename (default QueryResults.txt,
                             .html or .csv), UTF-8; 0: appended to the body
                             after a line break
             @query_no_truncate 1: large values are not cut; as documented,
                             the result then has no column headers
             @mailitem_id    OUTPUT INT: the queue's mail ID (NULL once IDs
                             pass 2,147,483,647: use @mailq_mail_id)
Extensions:  (not in sp_send_dbmail; named mailq_ so that they cannot be
             mistaken for Database Mail's)
             @mailq_query_result_format  'TEXT' (default, Database Mail's
                             layout), 'HTML' (a table) or 'CSV'
             @mailq_mail_id  OUTPUT BIGINT: the queue's mail ID, always
Result:      no result set; the message 'Mail (Id: n) queued.' unless
             @exclude_query_output = 1.  Returns 0; every failure is an error.
Errors:      50190 no @recipients; 50191 @file_attachments given;
             50192 @body_format, @importance or @sensitivity not a documented
             value; 50193 a query option out of range (@query_result_width not
             10-32767, @query_result_no_padding with @query_no_truncate,
             @mailq_query_result_format not TEXT/HTML/CSV, query options
             without @query); 50194 @execute_query_database not a database
             the caller can use; 50195 the query failed and
             @append_query_error = 0 (the message carries the query's error);
             50196 the query's result cannot be rendered (see
             RenderDbMailQuery); 50197 no content (no @body, @query or
             @subject); 50250 unknown profile or no default profile;
             50251 the caller may not use the profile; 50252 the profile has
             no account; and every error of mailq.EnqueueMail (addresses
             50101-50105, sizes 50111-50113 ...).
Transaction: the query runs first, outside any transaction of ours; then the
             enqueue and its DbMailItem row in one transaction: its own if
             none is open, else the caller's (no savepoint).  An error of the
             enqueue dooms the caller's transaction (XACT_ABORT ON) and is
             re-raised; nothing is queued.  One exception: a 50196 raised
             while RenderDbMailQuery describes and loads the caller's query
             (a column type a temp table cannot hold) comes with XACT_ABORT
             OFF, so nothing is queued but the caller's open transaction
             stays usable unless the underlying error doomed it.  Every
             other error, 50195 included, dooms it.
Isolation:   the caller's; reads of profiles and accounts are plain reads.
Lock order:  (via EnqueueMail) mailq.MailQueue, mailq.MailAttachment, then
             mailq.DbMailItem.
Example:     EXEC mailq.SendDbMail @profile_name = N'Ops',
                 @recipients = 'dba@example.com', @subject = N'Backups',
                 @query = N'SELECT name, state_desc FROM sys.databases;',
                 @attach_query_result_as_file = 1;
*/
CREATE OR ALTER PROCEDURE mailq.SendDbMail
    @profile_name SYSNAME = NULL,
    @recipients VARCHAR(MAX) = NULL,
    @copy_recipients VARCHAR(MAX) = NULL,
    @blind_copy_recipients VARCHAR(MAX) = NULL,
    @from_address VARCHAR(MAX) = NULL,
    @reply_to VARCHAR(MAX) = NULL,
    @subject NVARCHAR(255) = NULL,
    @body NVARCHAR(MAX) = NULL,
    @body_format VARCHAR(20) = NULL,
    @importance VARCHAR(6) = 'NORMAL',
    @sensitivity VARCHAR(12) = 'NORMAL',
    @file_attachments NVARCHAR(MAX) = NULL,
    @query NVARCHAR(MAX) = NULL,
    @execute_query_database SYSNAME = NULL,
    @attach_query_result_as_file BIT = 0,
    @query_attachment_filename NVARCHAR(255) = NULL,
    @query_result_header BIT = 1,
    @query_result_width INT = 256,
    @query_result_separator CHAR(1) = ' ',
    @exclude_query_output BIT = 0,
    @append_query_error BIT = 0,
    @query_no_truncate BIT = 0,
    @query_result_no_padding BIT = 0,
    @mailitem_id INT = NULL OUTPUT,
    @mailq_query_result_format VARCHAR(4) = 'TEXT',
    @mailq_mail_id BIGINT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Msg NVARCHAR(2048);
    DECLARE @CrLf NCHAR(2) = NCHAR(13) + NCHAR(10);
    DECLARE @BodyFormat VARCHAR(20) = UPPER(LTRIM(RTRIM(COALESCE(@body_format, 'TEXT'))));
    DECLARE @ImportanceValue VARCHAR(6) = UPPER(LTRIM(RTRIM(COALESCE(@importance, 'NORMAL'))));
    DECLARE @SensitivityValue VARCHAR(12) = UPPER(LTRIM(RTRIM(COALESCE(@sensitivity, 'NORMAL'))));
    DECLARE @Format VARCHAR(4) = UPPER(LTRIM(RTRIM(COALESCE(@mailq_query_result_format, 'TEXT'))));
    DECLARE @Database SYSNAME = COALESCE(@execute_query_database, DB_NAME());
    SET @attach_query_result_as_file = COALESCE(@attach_query_result_as_file, 0);
    SET @query_result_header = COALESCE(@query_result_header, 1);
    SET @query_result_width = COALESCE(@query_result_width, 256);
    SET @query_result_separator = COALESCE(@query_result_separator, ' ');
    SET @exclude_query_output = COALESCE(@exclude_query_output, 0);
    SET @append_query_error = COALESCE(@append_query_error, 0);
    SET @query_no_truncate = COALESCE(@query_no_truncate, 0);
    SET @query_result_no_padding = COALESCE(@query_result_no_padding, 0);
    SET @mailitem_id = NULL;
    SET @mailq_mail_id = NULL;

    -- 1. Validate before anything runs.
    IF @file_attachments IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@file_attachments is not supported: the sender worker runs on another machine and never reads ',
            N'the database server''s disk. Send the file''s content with mailq.EnqueueMail @Attachments ',
            N'(JSON, base64), or a query''s result with @query and @attach_query_result_as_file = 1.'
        );
        THROW 50191, @Msg, 1;
    END;
    IF NULLIF(LTRIM(RTRIM(@recipients)), '') IS NULL
    BEGIN
        SET @Msg = IIF(
            COALESCE(@copy_recipients, @blind_copy_recipients) IS NULL,
            N'@recipients, @copy_recipients or @blind_copy_recipients is required (separate addresses with ;).',
            N'@recipients is required: mailq-db sends no mail without a To address; '
            + N'move one Cc/Bcc address to @recipients.'
        );
        THROW 50190, @Msg, 1;
    END;
    IF @body IS NULL AND @query IS NULL AND @subject IS NULL
        THROW 50197, N'No content: give at least one of @body, @query or @subject.', 1;
    IF @BodyFormat NOT IN ('TEXT', 'HTML')
    BEGIN
        SET @Msg = CONCAT(N'@body_format must be TEXT or HTML; got ''', @body_format, N'''.');
        THROW 50192, @Msg, 1;
    END;
    IF @ImportanceValue NOT IN ('LOW', 'NORMAL', 'HIGH')
    BEGIN
        SET @Msg = CONCAT(N'@importance must be Low, Normal or High; got ''', @importance, N'''.');
        THROW 50192, @Msg, 1;
    END;
    IF @SensitivityValue NOT IN ('NORMAL', 'PERSONAL', 'PRIVATE', 'CONFIDENTIAL')
    BEGIN
        SET @Msg = CONCAT(
            N'@sensitivity must be Normal, Personal, Private or Confidential; got ''', @sensitivity, N'''.'
        );
        THROW 50192, @Msg, 1;
    END;
    IF @query IS NULL AND (@attach_query_result_as_file = 1 OR @query_attachment_filename IS NOT NULL)
        THROW 50193, N'@attach_query_result_as_file and @query_attachment_filename need a @query.', 1;
    IF @query_result_width NOT BETWEEN 10 AND 32767
    BEGIN
        SET @Msg = CONCAT(N'@query_result_width must be 10-32767; got ', @query_result_width, N'.');
        THROW 50193, @Msg, 1;
    END;
    IF @query_result_no_padding = 1 AND @query_no_truncate = 1
        THROW 50193,
            N'@query_result_no_padding and @query_no_truncate are mutually exclusive (as in Database Mail).',
            1;
    IF @Format NOT IN ('TEXT', 'HTML', 'CSV')
    BEGIN
        SET @Msg = CONCAT(
            N'@mailq_query_result_format must be TEXT, HTML or CSV; got ''', @mailq_query_result_format, N'''.'
        );
        THROW 50193, @Msg, 1;
    END;
    IF @query IS NOT NULL AND (DB_ID(@Database) IS NULL OR HAS_DBACCESS(@Database) <> 1)
    BEGIN
        SET @Msg = CONCAT(
            N'@execute_query_database ''', @Database, N''' is not a database you can use ',
            N'(it does not exist, is not online, or you have no user in it).'
        );
        THROW 50194, @Msg, 1;
    END;

    -- 2. Profile: the named one if the caller may use it (a public profile,
    --    one granted to the caller or to a role the caller is in; db_owner
    --    members may use every profile), else the caller's default, a role's
    --    default, the default public profile.  IS_MEMBER and USER_NAME see the
    --    caller: this procedure has no EXECUTE AS.
    DECLARE @ProfileID INT;
    IF @profile_name IS NOT NULL
    BEGIN
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p
        WHERE p.ProfileName = @profile_name;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@profile_name ''', @profile_name, N''' is not a profile (mailq.UpsertDbMailProfile).');
            THROW 50250, @Msg, 1;
        END;
        IF
            COALESCE(IS_MEMBER(N'db_owner'), 0) = 0
            AND NOT EXISTS (
                SELECT 1
                FROM mailq.DbMailPrincipalProfile AS pp
                WHERE
                    pp.ProfileID = @ProfileID
                    AND (pp.PrincipalName IN (N'public', USER_NAME()) OR IS_MEMBER(pp.PrincipalName) = 1)
            )
        BEGIN
            SET @Msg = CONCAT(
                N'@profile_name ''', @profile_name, N''' is private and not granted to ', USER_NAME(),
                N' (mailq.UpsertDbMailPrincipalProfile).'
            );
            THROW 50251, @Msg, 1;
        END;
    END;
    ELSE
    BEGIN
        SELECT TOP (1) @ProfileID = pp.ProfileID
        FROM mailq.DbMailPrincipalProfile AS pp
        WHERE
            pp.IsDefault = 1
            AND (pp.PrincipalName IN (N'public', USER_NAME()) OR IS_MEMBER(pp.PrincipalName) = 1)
        ORDER BY
            CASE pp.PrincipalName WHEN USER_NAME() THEN 0 WHEN N'public' THEN 2 ELSE 1 END,
            pp.PrincipalName;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(
                N'@profile_name is NULL and there is no default profile for you, your roles or public ',
                N'(mailq.UpsertDbMailPrincipalProfile @IsDefault = 1).'
            );
            THROW 50250, @Msg, 1;
        END;
    END;

    -- Failover, decided now: the profile's first account that is not blocked;
    -- when all are blocked, the first (the mail waits for it).  A queued mail
    -- keeps its account (ClaimMail does not re-route).
    DECLARE @AccountName NVARCHAR(128);
    SELECT TOP (1) @AccountName = a.AccountName
    FROM mailq.DbMailProfileAccount AS pa
    INNER JOIN mailq.DbMailAccount AS da ON pa.AccountID = da.AccountID
    INNER JOIN mailq.SendingAccount AS a ON da.AccountName = a.AccountName
    WHERE pa.ProfileID = @ProfileID
    ORDER BY IIF(a.BlockedUntilUtc > @Now, 1, 0), pa.SequenceNumber, pa.AccountID;
    IF @AccountName IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'Profile ', COALESCE(@profile_name, CONCAT(N'#', @ProfileID)),
            N' has no account (mailq.UpsertDbMailProfileAccount).'
        );
        THROW 50252, @Msg, 1;
    END;

    -- From: Database Mail takes 'Name <address>'; EnqueueMail takes the two apart.
    DECLARE @FromAddress NVARCHAR(MAX) = @from_address, @FromName NVARCHAR(MAX);
    IF (SELECT COUNT(*) FROM mailq.ParseAddressList(@from_address)) = 1
        SELECT
            @FromAddress = a.Address,
            @FromName = a.DisplayName
        FROM mailq.ParseAddressList(@from_address) AS a;

    -- Importance and sensitivity as headers (constants: no escaping needed).
    DECLARE @Headers NVARCHAR(MAX) = (
        SELECT N'{' + STRING_AGG(CONCAT(N'"', h.HeaderName, N'": "', h.HeaderValue, N'"'), N', ') + N'}'
        FROM (
            VALUES
            ('HIGH', NULL, N'X-Priority', N'1'), ('HIGH', NULL, N'Priority', N'urgent'),
            ('HIGH', NULL, N'Importance', N'high'),
            ('LOW', NULL, N'X-Priority', N'5'), ('LOW', NULL, N'Priority', N'non-urgent'),
            ('LOW', NULL, N'Importance', N'low'),
            (NULL, 'PERSONAL', N'Sensitivity', N'Personal'), (NULL, 'PRIVATE', N'Sensitivity', N'Private'),
            (NULL, 'CONFIDENTIAL', N'Sensitivity', N'Company-Confidential')
        ) AS h(Importance, Sensitivity, HeaderName, HeaderValue)
        WHERE h.Importance = @ImportanceValue OR h.Sensitivity = @SensitivityValue
    );

    -- 3. The query, now, as the caller, before any transaction of ours.
    DECLARE @MailBody NVARCHAR(MAX) = COALESCE(@body, N''), @Attachments NVARCHAR(MAX);
    IF @query IS NOT NULL
    BEGIN
        DECLARE @Rendered NVARCHAR(MAX), @QueryError NVARCHAR(4000);
        DECLARE @Separator NCHAR(1) = @query_result_separator;
        -- "When set [@query_no_truncate], query results do not include column
        -- headers" (the reference page above).
        DECLARE @Header BIT = IIF(@query_no_truncate = 1, 0, @query_result_header);
        EXEC mailq.RenderDbMailQuery
            @Query = @query,
            @Database = @Database,
            @Header = @Header,
            @Width = @query_result_width,
            @Separator = @Separator,
            @NoTruncate = @query_no_truncate,
            @NoPadding = @query_result_no_padding,
            @Format = @Format,
            @Result = @Rendered OUTPUT,
            @QueryError = @QueryError OUTPUT;

        IF @QueryError IS NOT NULL
        BEGIN
            IF @append_query_error = 0
            BEGIN
                SET @Msg = CONCAT(
                    N'@query failed, so no mail was queued (@append_query_error = 1 sends it with the error): ',
                    LEFT(@QueryError, 1800)
                );
                THROW 50195, @Msg, 1;
            END;
            SET @Rendered = CONCAT(@Rendered, @QueryError);
        END;

        IF @attach_query_result_as_file = 1
            -- FOR JSON writes VARBINARY as base64: the form EnqueueMail's
            -- @Attachments takes.  The text is stored as UTF-8.
            SET @Attachments = (
                SELECT
                    COALESCE(
                        @query_attachment_filename,
                        CONCAT(
                            N'QueryResults.',
                            CASE @Format WHEN 'HTML' THEN N'html' WHEN 'CSV' THEN N'csv' ELSE N'txt' END
                        )
                    ) AS FileName,
                    CASE @Format
                        WHEN 'HTML' THEN N'text/html; charset=utf-8'
                        WHEN 'CSV' THEN N'text/csv; charset=utf-8'
                        ELSE N'text/plain; charset=utf-8'
                    END AS ContentType,
                    CAST(
                        CAST(COALESCE(@Rendered, N'') COLLATE Latin1_General_100_CI_AS_SC_UTF8 AS VARCHAR(MAX))
                        AS VARBINARY(MAX)
                    ) AS ContentBase64
                FOR JSON PATH
            );
        ELSE
            SET @MailBody = CONCAT(@MailBody, IIF(@MailBody = N'', N'', @CrLf), @Rendered);
    END;

    -- 4. Enqueue (all validation, Message-ID and application rules live in
    --    EnqueueMail) and record the Database Mail details, in one transaction.
    DECLARE @MailID BIGINT;
    DECLARE @MailSubject NVARCHAR(255) = COALESCE(@subject, N'SQL Server Message');
    DECLARE @EnqueueFormat NVARCHAR(20) = IIF(@BodyFormat = 'HTML', N'Html', N'Text');
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        EXEC mailq.EnqueueMail
            @ToAddress = @recipients,
            @CC = @copy_recipients,
            @BCC = @blind_copy_recipients,
            @Subject = @MailSubject,
            @Body = @MailBody,
            @BodyFormat = @EnqueueFormat,
            @FromAddress = @FromAddress,
            @FromName = @FromName,
            @ReplyTo = @reply_to,
            @Headers = @Headers,
            @AccountName = @AccountName,
            @Attachments = @Attachments,
            @MailID = @MailID OUTPUT;

        INSERT INTO mailq.DbMailItem (
            MailID, ProfileID, Importance, Sensitivity, Query, ExecuteQueryDatabase,
            AttachQueryResultAsFile, QueryResultHeader, QueryResultWidth, QueryResultSeparator,
            ExcludeQueryOutput, AppendQueryError, SendRequestUser
        )
        VALUES (
            @MailID, @ProfileID, @ImportanceValue, @SensitivityValue, @query, IIF(@query IS NULL, NULL, @Database),
            @attach_query_result_as_file, @query_result_header, @query_result_width, @query_result_separator,
            @exclude_query_output, @append_query_error, COALESCE(SUSER_SNAME(), USER_NAME())
        );

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;

    SET @mailq_mail_id = @MailID;
    IF @MailID <= 2147483647 SET @mailitem_id = @MailID;
    IF @exclude_query_output = 0
    BEGIN
        SET @Msg = CONCAT(N'Mail (Id: ', @MailID, N') queued.');
        PRINT @Msg;
    END;
    RETURN 0;
END;
