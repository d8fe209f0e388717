/*
mailq.AddSuppression: suppresses an address for a sending account (or one of
its applications) and takes it out of the mail already queued for it
(mailq.ApplySuppressions).  Adding an existing suppression renews it.
Parameters:  @AccountName NVARCHAR(128), required; @Address NVARCHAR(320), required
             (stored lower-case); @Reason NVARCHAR(16) = 'Manual' (Manual, HardBounce,
             SoftBounce, Complaint, Unsubscribe); @Source NVARCHAR(200), required
             (who); @AppName NVARCHAR(128) = NULL (every application); @Detail
             NVARCHAR(1000) = NULL; @ExpiresAtUtc DATETIME2(3) = NULL (forever).
Result set:  one row: AccountName, AppName, Address, Reason, SweptMails INT,
             StoppedMails INT (stopped because nobody was left).
Errors:      50601 @AccountName not a sending account; 50602 @Address not one
             address of 1-320 characters; 50603 @Reason; 50604 @Source missing or
             over 200 characters; 50605 @ExpiresAtUtc not in the future; 50606
             @AppName not a registered application.
Transaction: its own if none is open, else the caller's; an error dooms either.
Isolation:   validation reads before the transaction; writes as ApplySuppressions.
Lock order:  mailq.ApplySuppressions's.
Example:     EXEC mailq.AddSuppression @AccountName = N'news', @Address = N'old@example.com',
                 @Source = N'dba:alice', @Detail = N'Customer asked by phone.';
*/
CREATE OR ALTER PROCEDURE mailq.AddSuppression
    @AccountName NVARCHAR(128),
    @Address NVARCHAR(400),
    @Source NVARCHAR(200),
    @Reason NVARCHAR(16) = N'Manual',
    @AppName NVARCHAR(128) = NULL,
    @Detail NVARCHAR(1000) = NULL,
    @ExpiresAtUtc DATETIME2(3) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @Reason = ISNULL(@Reason, N'Manual');
    SET @Address = LOWER(LTRIM(RTRIM(@Address)));
    IF @AccountName IS NULL OR NOT EXISTS (
        SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @AccountName
    )
    BEGIN
        SET @Msg = CONCAT(N'@AccountName ''', @AccountName, N''' is not a sending account.');
        THROW 50601, @Msg, 1;
    END;
    IF @Address IS NULL OR LEN(@Address) > 320 OR @Address NOT LIKE N'%_@_%' OR @Address LIKE N'%@%@%'
        OR @Address LIKE N'%[ ;,<>]%'
    BEGIN
        SET @Msg = CONCAT(N'@Address ''', @Address, N''' is not one address of 1-320 characters.');
        THROW 50602, @Msg, 1;
    END;
    IF @Reason NOT IN (N'Manual', N'HardBounce', N'SoftBounce', N'Complaint', N'Unsubscribe')
    BEGIN
        SET @Msg = CONCAT(N'@Reason is ''', @Reason, N'''; it must be Manual, HardBounce, SoftBounce, ',
            N'Complaint or Unsubscribe.');
        THROW 50603, @Msg, 1;
    END;
    IF NULLIF(LTRIM(RTRIM(@Source)), N'') IS NULL
        THROW 50604, N'@Source is required (1-200 characters): who adds the suppression.', 1;
    IF @ExpiresAtUtc <= SYSUTCDATETIME()
    BEGIN
        SET @Msg = CONCAT(N'@ExpiresAtUtc must be in the future (UTC); got ',
            CONVERT(NVARCHAR(30), @ExpiresAtUtc, 126), N'.');
        THROW 50605, @Msg, 1;
    END;
    IF @AppName IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mailq.Application AS a WHERE a.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(N'@AppName ''', @AppName, N''' is not a registered application.');
        THROW 50606, @Msg, 1;
    END;
    DECLARE @Suppressions NVARCHAR(MAX) = (
        SELECT
            @AccountName AS AccountName,
            @Address AS Address,
            @AppName AS AppName,
            @Reason AS Reason,
            @Source AS Source,
            @Detail AS Detail,
            CONVERT(NVARCHAR(30), @ExpiresAtUtc, 126) AS ExpiresAtUtc
        FOR JSON PATH
    );
    DECLARE @Swept INT, @Stopped INT;
    -- mailq.ApplySuppressions owns or joins the transaction itself (one call).
    EXEC mailq.ApplySuppressions @Suppressions = @Suppressions, @SweptMails = @Swept OUTPUT,
        @StoppedMails = @Stopped OUTPUT;
    SELECT
        @AccountName AS AccountName,
        @AppName AS AppName,
        @Address AS Address,
        @Reason AS Reason,
        @Swept AS SweptMails,
        @Stopped AS StoppedMails;
END;
