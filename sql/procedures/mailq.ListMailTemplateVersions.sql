/*
mailq.ListMailTemplateVersions: the versions of one mail template, newest
first, without their bodies (mailq.GetMailTemplate @Version reads one).
Parameters:  @TemplateName NVARCHAR(128), required.
Result set:  one row per version: TemplateName, Version, SubjectTemplate, HtmlChars,
             TextChars (NULL when that body is absent), CreatedBy, CreatedAtUtc.
Errors:      50210 @TemplateName missing or invalid; 50215 no template has this name.
Transaction: reads only; none of its own.
Isolation:   the caller's (a seek on the primary key's leading column).
Lock order:  mailq.MailTemplate, then mailq.MailTemplateVersion (shared).
Example:     EXEC mailq.ListMailTemplateVersions @TemplateName = N'welcome';
*/
CREATE OR ALTER PROCEDURE mailq.ListMailTemplateVersions
    @TemplateName NVARCHAR(4000)
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
    IF NOT EXISTS (SELECT 1 FROM mailq.MailTemplate AS t WHERE t.TemplateName = @TemplateName)
    BEGIN
        SET @Msg = CONCAT(N'No template is named ', QUOTENAME(LEFT(@TemplateName, 128), N''''),
                          N' (mailq.ListMailTemplates lists them).');
        THROW 50215, @Msg, 1;
    END;
    SELECT
        v.TemplateName,
        v.Version,
        v.SubjectTemplate,
        LEN(v.HtmlTemplate) AS HtmlChars,
        LEN(v.TextTemplate) AS TextChars,
        v.CreatedBy,
        v.CreatedAtUtc
    FROM mailq.MailTemplateVersion AS v
    WHERE v.TemplateName = @TemplateName
    ORDER BY v.Version DESC;
END;
