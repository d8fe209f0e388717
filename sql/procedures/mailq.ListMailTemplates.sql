/*
mailq.ListMailTemplates: the mail templates, one row per name, in name order.
Parameters:  @IncludeRetired BIT, default 0: 1 lists retired templates too.
Result set:  TemplateName, LatestVersion, Description, CreatedAtUtc,
             LatestVersionCreatedAtUtc, LatestVersionCreatedBy, RetiredAtUtc,
             RetiredBy, RetiredReason.
Errors:      none.
Transaction: reads only; none of its own.
Isolation:   the caller's; one seek per template for its latest version.
Lock order:  mailq.MailTemplate, then mailq.MailTemplateVersion.
Example:     EXEC mailq.ListMailTemplates @IncludeRetired = 1;
*/
CREATE OR ALTER PROCEDURE mailq.ListMailTemplates
    @IncludeRetired BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SELECT
        t.TemplateName,
        t.LatestVersion,
        t.Description,
        t.CreatedAtUtc,
        v.CreatedAtUtc AS LatestVersionCreatedAtUtc,
        v.CreatedBy AS LatestVersionCreatedBy,
        t.RetiredAtUtc,
        t.RetiredBy,
        t.RetiredReason
    FROM mailq.MailTemplate AS t
    INNER JOIN mailq.MailTemplateVersion AS v
        ON t.TemplateName = v.TemplateName AND t.LatestVersion = v.Version
    WHERE t.RetiredAtUtc IS NULL OR ISNULL(@IncludeRetired, 0) = 1
    ORDER BY t.TemplateName;
END;
