/*
mailq.RetireMailTemplate: retires a mail template (new mail may not use it: 50216)
or brings it back (@Retire = 0).  Its versions stay: pinned mail still renders.
Retiring a retired template changes nothing (Changed = 0).
Parameters:  @TemplateName NVARCHAR(128), required; @Retire BIT = 1; @Reason NVARCHAR(400)
Result set:  one row: TemplateName, LatestVersion, RetiredAtUtc, RetiredBy,
             RetiredReason, Changed BIT.
Errors:      50210 @TemplateName missing or invalid; 50213 @Reason too long; 50215 unknown.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here; one UPDATE of one row by key.
Lock order:  mailq.MailTemplate only.
Example:     EXEC mailq.RetireMailTemplate @TemplateName = N'welcome', @Reason = N'replaced';
*/
CREATE OR ALTER PROCEDURE mailq.RetireMailTemplate
    @TemplateName NVARCHAR(4000),
    @Retire BIT = 1,
    @Reason NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(@TemplateName, N'') IS NULL OR LEN(@TemplateName) > 128
    BEGIN
        SET @Msg = CONCAT(N'@TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ -; got ',
                          IIF(@TemplateName IS NULL, N'NULL', QUOTENAME(LEFT(@TemplateName, 200), N'''')), N'.');
        THROW 50210, @Msg, 1;
    END;
    IF LEN(@Reason) > 400
        THROW 50213, N'@Reason is limited to 400 characters.', 1;
    SET @Retire = ISNULL(@Retire, 1);
    DECLARE @Changed TABLE (
        TemplateName NVARCHAR(128) NOT NULL,
        LatestVersion INT NOT NULL,
        RetiredAtUtc DATETIME2(3) NULL,
        RetiredBy NVARCHAR(128) NULL,
        RetiredReason NVARCHAR(400) NULL
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        UPDATE t
        SET
            t.RetiredAtUtc = IIF(@Retire = 1, SYSUTCDATETIME(), NULL),
            t.RetiredBy = IIF(@Retire = 1, SUSER_SNAME(), NULL),
            t.RetiredReason = IIF(@Retire = 1, @Reason, NULL)
        OUTPUT inserted.TemplateName, inserted.LatestVersion, inserted.RetiredAtUtc,
            inserted.RetiredBy, inserted.RetiredReason
        INTO @Changed (TemplateName, LatestVersion, RetiredAtUtc, RetiredBy, RetiredReason)
        FROM mailq.MailTemplate AS t
        WHERE
            t.TemplateName = @TemplateName
            AND ((@Retire = 1 AND t.RetiredAtUtc IS NULL) OR (@Retire = 0 AND t.RetiredAtUtc IS NOT NULL));
        IF NOT EXISTS (SELECT 1 FROM @Changed)
            AND NOT EXISTS (SELECT 1 FROM mailq.MailTemplate AS t WHERE t.TemplateName = @TemplateName)
        BEGIN
            SET @Msg = CONCAT(N'No template is named ', QUOTENAME(LEFT(@TemplateName, 128), N''''),
                              N' (mailq.ListMailTemplates lists them).');
            THROW 50215, @Msg, 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        c.TemplateName,
        c.LatestVersion,
        c.RetiredAtUtc,
        c.RetiredBy,
        c.RetiredReason,
        CAST(1 AS BIT) AS Changed
    FROM @Changed AS c
    UNION ALL
    SELECT
        t.TemplateName,
        t.LatestVersion,
        t.RetiredAtUtc,
        t.RetiredBy,
        t.RetiredReason,
        CAST(0 AS BIT) AS Changed
    FROM mailq.MailTemplate AS t
    WHERE t.TemplateName = @TemplateName AND NOT EXISTS (SELECT 1 FROM @Changed);
END;
