/*
mailq.UpsertSendingAccount: creates a sending account (and its rate budget row)
or changes only the settings it is given (SMTP settings live in the worker's config).
Parameters:  @AccountName NVARCHAR(128), required
             @DefaultFromAddress NVARCHAR(320): one bare address; required to create
             @DefaultFromName NVARCHAR(200); @PerMinuteLimit, @PerHourLimit,
             @PerDayLimit INT > 0; @MinLoginIntervalMs INT 1-86,400,000
             @IsDefault BIT: 1 = the account EnqueueMail uses without @AccountName
             (replaces the previous one); 0 = no longer the default
             NULL keeps what is stored; @Clear NVARCHAR(4000): comma-separated
             settings to remove (DefaultFromName, PerMinuteLimit, PerHourLimit,
             PerDayLimit, MinLoginIntervalMs)
Result set:  none.
Errors:      50142 @AccountName missing; 50103 a value over its size; 50105 CR/LF
             in @DefaultFromName; 50102 @DefaultFromAddress invalid; 50143 a limit
             not positive; 50122 @MinLoginIntervalMs out of range; 50503 a new
             account without @DefaultFromAddress; 50504 @Clear names another
             setting, or one also given a value.  Nothing is written.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED and the SET options of filtered-index DML, set here.
Lock order:  mailq.SendingAccount (row, then previous default), mailq.RateBudget.
Example:     EXEC mailq.UpsertSendingAccount @AccountName = N'qq', @PerMinuteLimit = 30;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertSendingAccount
    @AccountName NVARCHAR(4000),
    @DefaultFromAddress NVARCHAR(4000) = NULL,
    @DefaultFromName NVARCHAR(4000) = NULL,
    @PerMinuteLimit INT = NULL,
    @PerHourLimit INT = NULL,
    @PerDayLimit INT = NULL,
    @IsDefault BIT = NULL,
    @MinLoginIntervalMs INT = NULL,
    @Clear NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET ANSI_WARNINGS, ANSI_PADDING, CONCAT_NULL_YIELDS_NULL ON;   -- filtered-index DML (else 1934)
    SET NUMERIC_ROUNDABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;
    IF LEN(@AccountName) > 128 OR LEN(@DefaultFromAddress) > 320 OR LEN(@DefaultFromName) > 200
        THROW 50103, N'@AccountName (128), @DefaultFromAddress (320) or @DefaultFromName (200) is over its size.', 1;
    IF @DefaultFromName COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(13) + NCHAR(10) + N']%'
        THROW 50105, N'@DefaultFromName contains CR or LF (header injection is refused).', 1;
    IF
        @DefaultFromAddress IS NOT NULL AND (
            (SELECT COUNT(*) FROM mailq.ParseAddressList(@DefaultFromAddress)) <> 1
            OR EXISTS (
                SELECT 1
                FROM mailq.ParseAddressList(@DefaultFromAddress) AS a
                WHERE a.Problem IS NOT NULL OR a.DisplayName IS NOT NULL
            )
        )
    BEGIN
        SET @Msg = CONCAT(
            N'@DefaultFromAddress must be one valid address; got ''', LEFT(@DefaultFromAddress, 100), N'''.'
        );
        THROW 50102, @Msg, 1;
    END;
    IF @PerMinuteLimit <= 0 OR @PerHourLimit <= 0 OR @PerDayLimit <= 0
        THROW 50143, N'@PerMinuteLimit, @PerHourLimit and @PerDayLimit must be positive (@Clear removes a limit).', 1;
    IF @MinLoginIntervalMs NOT BETWEEN 1 AND 86400000
    BEGIN
        SET @Msg = CONCAT(
            N'@MinLoginIntervalMs must be 1-86400000 milliseconds (24 hours; @Clear removes it); got ',
            @MinLoginIntervalMs, N'.'
        );
        THROW 50122, @Msg, 1;
    END;
    -- @Clear: each name once, known, and not also given a value.
    DECLARE @Cleared TABLE (Setting NVARCHAR(128) NOT NULL PRIMARY KEY, Given BIT NULL);
    INSERT INTO @Cleared (Setting, Given)
    SELECT DISTINCT s.Setting, v.Given
    FROM STRING_SPLIT(@Clear, N',') AS c
    CROSS APPLY (VALUES (LEFT(LTRIM(RTRIM(c.value)), 128))) AS s(Setting)
    LEFT JOIN (
        VALUES
        (N'DefaultFromName', IIF(@DefaultFromName IS NULL, 0, 1)),
        (N'PerMinuteLimit', IIF(@PerMinuteLimit IS NULL, 0, 1)),
        (N'PerHourLimit', IIF(@PerHourLimit IS NULL, 0, 1)),
        (N'PerDayLimit', IIF(@PerDayLimit IS NULL, 0, 1)),
        (N'MinLoginIntervalMs', IIF(@MinLoginIntervalMs IS NULL, 0, 1))
    ) AS v(Setting, Given) ON s.Setting = v.Setting
    WHERE s.Setting <> N'';
    SELECT TOP (1) @Msg = CONCAT(N'@Clear: ''', LEFT(c.Setting, 100), IIF(c.Given IS NULL,
        N''' is not a setting that can be removed (DefaultFromName, PerMinuteLimit, PerHourLimit, PerDayLimit, '
        + N'MinLoginIntervalMs).', N''' is also given a value: give a value or remove it, not both.'))
    FROM @Cleared AS c
    WHERE c.Given IS NULL OR c.Given = 1;
    IF @Msg IS NOT NULL THROW 50504, @Msg, 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race (a small admin table).
        DECLARE @Exists BIT = IIF(EXISTS (
            SELECT 1 FROM mailq.SendingAccount AS a WITH (UPDLOCK, HOLDLOCK) WHERE a.AccountName = @AccountName
        ), 1, 0);
        IF @Exists = 0 AND @DefaultFromAddress IS NULL
        BEGIN
            SET @Msg = CONCAT(
                N'@DefaultFromAddress is required to create sending account ''', LEFT(@AccountName, 128), N'''.'
            );
            THROW 50503, @Msg, 1;
        END;
        -- One default at most: the previous one stops being it first.
        IF @IsDefault = 1
            UPDATE a
            SET a.IsDefault = 0
            FROM mailq.SendingAccount AS a
            WHERE a.IsDefault = 1 AND a.AccountName <> @AccountName;
        IF @Exists = 1
            UPDATE a
            SET
                a.DefaultFromAddress = COALESCE(LTRIM(RTRIM(@DefaultFromAddress)), a.DefaultFromAddress),
                a.DefaultFromName = IIF(c.Name = 1, NULL, COALESCE(@DefaultFromName, a.DefaultFromName)),
                a.PerMinuteLimit = IIF(c.Minute = 1, NULL, COALESCE(@PerMinuteLimit, a.PerMinuteLimit)),
                a.PerHourLimit = IIF(c.Hour = 1, NULL, COALESCE(@PerHourLimit, a.PerHourLimit)),
                a.PerDayLimit = IIF(c.Day = 1, NULL, COALESCE(@PerDayLimit, a.PerDayLimit)),
                a.IsDefault = COALESCE(@IsDefault, a.IsDefault),
                a.MinLoginIntervalMs = IIF(c.Login = 1, NULL, COALESCE(@MinLoginIntervalMs, a.MinLoginIntervalMs))
            FROM mailq.SendingAccount AS a
            CROSS APPLY (
                SELECT
                    MAX(IIF(k.Setting = N'DefaultFromName', 1, 0)) AS Name,
                    MAX(IIF(k.Setting = N'PerMinuteLimit', 1, 0)) AS Minute,
                    MAX(IIF(k.Setting = N'PerHourLimit', 1, 0)) AS Hour,
                    MAX(IIF(k.Setting = N'PerDayLimit', 1, 0)) AS Day,
                    MAX(IIF(k.Setting = N'MinLoginIntervalMs', 1, 0)) AS Login
                FROM @Cleared AS k
            ) AS c
            WHERE a.AccountName = @AccountName;
        ELSE
            INSERT INTO mailq.SendingAccount (
                AccountName, DefaultFromAddress, DefaultFromName,
                PerMinuteLimit, PerHourLimit, PerDayLimit, IsDefault, MinLoginIntervalMs
            )
            VALUES (
                @AccountName, LTRIM(RTRIM(@DefaultFromAddress)), @DefaultFromName,
                @PerMinuteLimit, @PerHourLimit, @PerDayLimit, COALESCE(@IsDefault, 0), @MinLoginIntervalMs
            );
        IF NOT EXISTS (SELECT 1 FROM mailq.RateBudget AS b WHERE b.AccountName = @AccountName)
            INSERT INTO mailq.RateBudget (AccountName) VALUES (@AccountName);
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
