/*
mailq.AddMailTemplateVersion: stores a new, never-changing version of a mail template (1 for a new
name); texts byte-equal to the latest add nothing (@Created 0), so redeploying is harmless.
Parameters:  @TemplateName NVARCHAR(128) (A-Z a-z 0-9 . _ -), @SubjectTemplate (1-4000), required;
             @HtmlTemplate, @TextTemplate: at least one, up to 2,000,000 characters; @Description NVARCHAR(400)
             (NULL keeps it); @ExpectedLatestVersion INT (0: a new name); @Version, @Created OUTPUT
Errors:      50210 @TemplateName; 50211 @SubjectTemplate; 50212 no body or too long; 50213 @Description;
             50214 @ExpectedLatestVersion < 0; 50216 retired; 50217 latest is not @ExpectedLatestVersion.
Transaction: its own if none is open, else the caller's; an error dooms it (XACT_ABORT ON).
Isolation:   sets READ COMMITTED.  Lock order: mailq.MailTemplate (UPDLOCK, HOLDLOCK: versions
             are numbered one at a time per name), then mailq.MailTemplateVersion.
Example:     EXEC mailq.AddMailTemplateVersion @TemplateName = N'hi', @SubjectTemplate = N'Hi', @TextTemplate = N'Hi';
*/
CREATE OR ALTER PROCEDURE mailq.AddMailTemplateVersion
    @TemplateName NVARCHAR(4000),
    @SubjectTemplate NVARCHAR(MAX),
    @HtmlTemplate NVARCHAR(MAX) = NULL,
    @TextTemplate NVARCHAR(MAX) = NULL,
    @Description NVARCHAR(4000) = NULL,
    @ExpectedLatestVersion INT = NULL,
    @Version INT = NULL OUTPUT,
    @Created BIT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SELECT @Version = NULL, @Created = 0;
    -- Name rule under a binary collation: a linguistic [A-Z] matches accented letters.
    IF NULLIF(@TemplateName, N'') IS NULL
        OR LEN(@TemplateName) > 128
        OR DATALENGTH(@TemplateName) <> 2 * LEN(@TemplateName)
        OR @TemplateName COLLATE Latin1_General_BIN2 LIKE N'%[^A-Za-z0-9._-]%'
    BEGIN
        SET @Msg = CONCAT(N'@TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ -; got ',
                          IIF(@TemplateName IS NULL, N'NULL', QUOTENAME(LEFT(@TemplateName, 200), N'''')), N'.');
        THROW 50210, @Msg, 1;
    END;
    IF NULLIF(@SubjectTemplate, N'') IS NULL OR LEN(@SubjectTemplate) > 4000
    BEGIN
        SET @Msg = CONCAT(N'@SubjectTemplate is required and limited to 4000 characters; got ',
                          IIF(@SubjectTemplate IS NULL, N'NULL', CONCAT(LEN(@SubjectTemplate), N' characters')), N'.');
        THROW 50211, @Msg, 1;
    END;
    SELECT @HtmlTemplate = NULLIF(@HtmlTemplate, N''), @TextTemplate = NULLIF(@TextTemplate, N'');
    IF @HtmlTemplate IS NULL AND @TextTemplate IS NULL
        THROW 50212, N'Give @HtmlTemplate, @TextTemplate or both: a template needs a body.', 1;
    IF LEN(@HtmlTemplate) > 2000000 OR LEN(@TextTemplate) > 2000000
    BEGIN
        SET @Msg = CONCAT(N'@HtmlTemplate and @TextTemplate are limited to 2,000,000 characters each ',
                          N'(EnqueueMail''s body limit).');
        THROW 50212, @Msg, 1;
    END;
    IF LEN(@Description) > 400
        THROW 50213, N'@Description is limited to 400 characters.', 1;
    IF @ExpectedLatestVersion < 0
    BEGIN
        SET @Msg = CONCAT(N'@ExpectedLatestVersion must be 0 (a new name) or a version number; got ',
                          @ExpectedLatestVersion, N'.');
        THROW 50214, @Msg, 1;
    END;
    DECLARE @Latest INT, @RetiredAtUtc DATETIME2(3);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        SELECT
            @Latest = t.LatestVersion,
            @RetiredAtUtc = t.RetiredAtUtc
        FROM mailq.MailTemplate AS t WITH (UPDLOCK, HOLDLOCK)
        WHERE t.TemplateName = @TemplateName;
        IF @ExpectedLatestVersion IS NOT NULL AND ISNULL(@Latest, 0) <> @ExpectedLatestVersion
        BEGIN
            SET @Msg = CONCAT(N'Template ', QUOTENAME(@TemplateName, N''''), N' is at version ',
                              ISNULL(@Latest, 0), N', not @ExpectedLatestVersion ', @ExpectedLatestVersion,
                              N': someone else added a version; read it and try again.');
            THROW 50217, @Msg, 1;
        END;
        IF @RetiredAtUtc IS NOT NULL
        BEGIN
            SET @Msg = CONCAT(N'Template ', QUOTENAME(@TemplateName, N''''),
                              N' is retired; mailq.RetireMailTemplate @Retire = 0 brings it back.');
            THROW 50216, @Msg, 1;
        END;
        -- VARBINARY compares bytes: a case-only change is a new version.
        IF EXISTS (
            SELECT 1
            FROM mailq.MailTemplateVersion AS v
            WHERE v.TemplateName = @TemplateName
                AND v.Version = @Latest
                AND CAST(v.SubjectTemplate AS VARBINARY(MAX)) = CAST(@SubjectTemplate AS VARBINARY(MAX))
                AND (
                    (v.HtmlTemplate IS NULL AND @HtmlTemplate IS NULL)
                    OR CAST(v.HtmlTemplate AS VARBINARY(MAX)) = CAST(@HtmlTemplate AS VARBINARY(MAX))
                )
                AND (
                    (v.TextTemplate IS NULL AND @TextTemplate IS NULL)
                    OR CAST(v.TextTemplate AS VARBINARY(MAX)) = CAST(@TextTemplate AS VARBINARY(MAX))
                )
        )
        BEGIN
            SET @Version = @Latest;
            IF @Description IS NOT NULL
                UPDATE t
                SET t.Description = @Description
                FROM mailq.MailTemplate AS t
                WHERE t.TemplateName = @TemplateName;
        END;
        ELSE
        BEGIN
            SET @Version = ISNULL(@Latest, 0) + 1;
            IF @Latest IS NULL
                INSERT INTO mailq.MailTemplate (TemplateName, LatestVersion, Description)
                VALUES (@TemplateName, @Version, @Description);
            ELSE
                UPDATE t
                SET
                    t.LatestVersion = @Version,
                    t.Description = ISNULL(@Description, t.Description)
                FROM mailq.MailTemplate AS t
                WHERE t.TemplateName = @TemplateName;
            INSERT INTO mailq.MailTemplateVersion (
                TemplateName, Version, SubjectTemplate, HtmlTemplate, TextTemplate
            )
            VALUES (@TemplateName, @Version, @SubjectTemplate, @HtmlTemplate, @TextTemplate);
            SET @Created = 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        SELECT @Version = NULL, @Created = 0;
        THROW;
    END CATCH;
END;
