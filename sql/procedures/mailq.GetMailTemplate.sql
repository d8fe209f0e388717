/*
mailq.GetMailTemplate: one version of a mail template, for rendering or review: without
@Version the latest (50216 when retired), with @Version that one even if retired.
Parameters:  @TemplateName NVARCHAR(128), required; @Version INT, optional (>= 1).
Result set:  one row: the version's texts, LatestVersion, Description, CreatedBy, CreatedAtUtc, RetiredAtUtc.
Errors:      50210 @TemplateName missing or invalid; 50214 @Version below 1; 50215 no such
             template or version; 50216 retired (no @Version).
Transaction: reads only.  Isolation: the caller's (a version row never changes).
Lock order:  mailq.MailTemplate, then mailq.MailTemplateVersion.
Example:     EXEC mailq.GetMailTemplate @TemplateName = N'welcome', @Version = 2;
*/
CREATE OR ALTER PROCEDURE mailq.GetMailTemplate
    @TemplateName NVARCHAR(4000),
    @Version INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(@TemplateName, N'') IS NULL OR LEN(@TemplateName) > 128
    BEGIN
        SET @Msg = CONCAT(N'@TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ -; got ',
                          IIF(@TemplateName IS NULL, N'NULL', QUOTENAME(LEFT(@TemplateName, 200), N'''')), N'.');
        THROW 50210, @Msg, 1;
    END;
    IF @Version < 1
    BEGIN
        SET @Msg = CONCAT(N'@Version must be 1 or more (NULL: the latest); got ', @Version, N'.');
        THROW 50214, @Msg, 1;
    END;
    DECLARE @Latest INT, @RetiredAtUtc DATETIME2(3);
    SELECT
        @Latest = t.LatestVersion,
        @RetiredAtUtc = t.RetiredAtUtc
    FROM mailq.MailTemplate AS t
    WHERE t.TemplateName = @TemplateName;
    IF @Latest IS NULL
    BEGIN
        SET @Msg = CONCAT(N'No template is named ', QUOTENAME(LEFT(@TemplateName, 128), N''''),
                          N' (mailq.ListMailTemplates lists them).');
        THROW 50215, @Msg, 1;
    END;
    IF @Version IS NULL AND @RetiredAtUtc IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(N'Template ', QUOTENAME(@TemplateName, N''''), N' is retired since ',
                          CONVERT(NVARCHAR(30), @RetiredAtUtc, 126),
                          N' UTC: new mail cannot use it (a given @Version still reads).');
        THROW 50216, @Msg, 1;
    END;
    IF @Version > @Latest
    BEGIN
        SET @Msg = CONCAT(N'Template ', QUOTENAME(@TemplateName, N''''), N' has no version ', @Version,
                          N'; its latest is ', @Latest, N'.');
        THROW 50215, @Msg, 1;
    END;
    SELECT
        v.TemplateName,
        v.Version,
        t.LatestVersion,
        v.SubjectTemplate,
        v.HtmlTemplate,
        v.TextTemplate,
        t.Description,
        v.CreatedBy,
        v.CreatedAtUtc,
        t.RetiredAtUtc
    FROM mailq.MailTemplate AS t
    INNER JOIN mailq.MailTemplateVersion AS v
        ON t.TemplateName = v.TemplateName
    WHERE
        t.TemplateName = @TemplateName
        AND v.Version = ISNULL(@Version, @Latest);
END;
