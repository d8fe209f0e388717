/*
mailq.CheckDbMailRequest (internal: mailq.SendDbMail's checks, before it writes;
granted to nobody, reached through ownership chaining): the profile the caller may
use, msdb's checks in msdb's order with its numbers and return codes, this
package's refusals, and the profile's account (failover: the first not blocked).
Parameters:  SendDbMail's, same names and types (@query already NULLIF'd);
             normalized in place (OUTPUT): @subject (default 'SQL Server Message'),
             @body_format, @importance, @sensitivity (upper case),
             @query_attachment_filename (trimmed, '' -> NULL);
             OUTPUT @ProfileID INT, @AccountName NVARCHAR(128).
Returns:     0 when SendDbMail may enqueue, else SendDbMail's return code after
             a RAISERROR severity 16 (its header lists them).
Result set:  none.  Errors: RAISERROR only, as SendDbMail documents.
Transaction: none of its own; writes nothing.  XACT_ABORT as the caller has it
             (not set here), so a refusal leaves a caller's transaction going.
Isolation:   the caller's (SendDbMail sets none).
Lock order:  reads only: the DbMail profile tables, mailq.SendingAccount.
Example:     EXEC @rc = mailq.CheckDbMailRequest @profile_name = @profile_name, ...;
*/
CREATE OR ALTER PROCEDURE mailq.CheckDbMailRequest
    @profile_name SYSNAME,
    @recipients VARCHAR(MAX),
    @copy_recipients VARCHAR(MAX),
    @blind_copy_recipients VARCHAR(MAX),
    @subject NVARCHAR(255) OUTPUT,
    @body NVARCHAR(MAX),
    @body_format VARCHAR(20) OUTPUT,
    @importance VARCHAR(6) OUTPUT,
    @sensitivity VARCHAR(12) OUTPUT,
    @file_attachments NVARCHAR(MAX),
    @query NVARCHAR(MAX),
    @execute_query_database SYSNAME,
    @attach_query_result_as_file BIT,
    @query_attachment_filename NVARCHAR(260) OUTPUT,
    @query_result_header BIT,
    @query_result_width INT,
    @query_result_separator CHAR(1),
    @exclude_query_output BIT,
    @append_query_error BIT,
    @query_no_truncate BIT,
    @query_result_no_padding BIT,
    @from_address VARCHAR(MAX),
    @reply_to VARCHAR(MAX),
    @mailq_query_result_format VARCHAR(4),
    @ProfileID INT OUTPUT,
    @AccountName NVARCHAR(128) OUTPUT
AS
BEGIN
    -- No SET XACT_ABORT: the checks RAISERROR and RETURN under the caller's setting.
    SET NOCOUNT ON;
    DECLARE @Msg NVARCHAR(2048), @rc INT, @FromList NVARCHAR(400);
    SELECT @ProfileID = NULL, @AccountName = NULL;
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
    RETURN 0;
END;
