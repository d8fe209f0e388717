/*
mailq.UpsertSendingAccount: creates a sending account or changes its
settings (and creates its rate budget row).  SMTP host and credentials are
not stored: the worker's configuration maps the account name to them.
Parameters:  @AccountName NVARCHAR(128), required
             @DefaultFromAddress NVARCHAR(320), required: one bare address
                        (the display name goes in @DefaultFromName)
             @DefaultFromName NVARCHAR(200), optional
             @PerMinuteLimit, @PerHourLimit, @PerDayLimit INT > 0, NULL = unlimited
             @IsDefault BIT, default 0: 1 makes this the account EnqueueMail
                        uses when @AccountName is NULL (the previous default is cleared)
             @MinLoginIntervalMs INT 1-86,400,000, optional: the least time
                        between two SMTP logins on the account across every
                        worker (mailq.AcquireLoginSlot); NULL = no interval
                        (like the limits, every call sets it: omitting it clears it)
Result set:  none.
Errors:      50142 @AccountName missing; 50103 a value over its size;
             50102 @DefaultFromAddress invalid; 50143 a limit not positive;
             50122 @MinLoginIntervalMs outside 1-86,400,000.
Transaction: opens its own if none is open, else works inside the caller's
             (no savepoint: SAVE TRANSACTION fails under MSDTC, error 627).  Any
             error is re-raised unchanged; XACT_ABORT ON dooms (XACT_STATE() = -1)
             or rolls back the caller's transaction, so the caller must roll back.
Isolation:   sets READ COMMITTED itself (UPDLOCK, HOLDLOCK insert-if-absent on a
             small admin table).
Lock order:  mailq.SendingAccount, then mailq.RateBudget (only the new account's
             row, which no other transaction can hold yet).
Example:     EXEC mailq.UpsertSendingAccount @AccountName = N'qq',
                 @DefaultFromAddress = N'noreply@example.com', @PerMinuteLimit = 20,
                 @PerHourLimit = 500, @PerDayLimit = 5000, @IsDefault = 1,
                 @MinLoginIntervalMs = 10000;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertSendingAccount
    @AccountName NVARCHAR(4000),
    @DefaultFromAddress NVARCHAR(4000),
    @DefaultFromName NVARCHAR(4000) = NULL,
    @PerMinuteLimit INT = NULL,
    @PerHourLimit INT = NULL,
    @PerDayLimit INT = NULL,
    @IsDefault BIT = 0,
    @MinLoginIntervalMs INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    SET @IsDefault = COALESCE(@IsDefault, 0);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;
    IF LEN(@AccountName) > 128 OR LEN(@DefaultFromAddress) > 320 OR LEN(@DefaultFromName) > 200
        THROW 50103, N'@AccountName (128), @DefaultFromAddress (320) or @DefaultFromName (200) is over its size.', 1;
    IF @DefaultFromName COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(13) + NCHAR(10) + N']%'
        THROW 50105, N'@DefaultFromName contains CR or LF (header injection is refused).', 1;
    IF
        @DefaultFromAddress IS NULL
        OR (SELECT COUNT(*) FROM mailq.ParseAddressList(@DefaultFromAddress)) <> 1
        OR EXISTS (
            SELECT 1
            FROM mailq.ParseAddressList(@DefaultFromAddress) AS a
            WHERE a.Problem IS NOT NULL OR a.DisplayName IS NOT NULL
        )
    BEGIN
        SET @Msg = CONCAT(
            N'@DefaultFromAddress must be one valid address; got ''', LEFT(@DefaultFromAddress, 100), N'''.'
        );
        THROW 50102, @Msg, 1;
    END;
    IF @PerMinuteLimit <= 0 OR @PerHourLimit <= 0 OR @PerDayLimit <= 0
        THROW 50143, N'@PerMinuteLimit, @PerHourLimit and @PerDayLimit must be positive, or NULL for no limit.', 1;
    IF @MinLoginIntervalMs NOT BETWEEN 1 AND 86400000
    BEGIN
        SET @Msg = CONCAT(
            N'@MinLoginIntervalMs must be 1-86400000 milliseconds (24 hours), or NULL for no interval; got ',
            @MinLoginIntervalMs, N'.'
        );
        THROW 50122, @Msg, 1;
    END;

    -- Own the transaction if none is open; otherwise work inside the caller's.
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;

        IF @IsDefault = 1
            UPDATE a
            SET a.IsDefault = 0
            FROM mailq.SendingAccount AS a
            WHERE a.IsDefault = 1 AND a.AccountName <> @AccountName;

        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race between two callers.
        IF EXISTS (
            SELECT 1
            FROM mailq.SendingAccount AS a WITH (UPDLOCK, HOLDLOCK)
            WHERE a.AccountName = @AccountName
        )
            UPDATE a
            SET
                a.DefaultFromAddress = LTRIM(RTRIM(@DefaultFromAddress)),
                a.DefaultFromName = @DefaultFromName,
                a.PerMinuteLimit = @PerMinuteLimit,
                a.PerHourLimit = @PerHourLimit,
                a.PerDayLimit = @PerDayLimit,
                a.IsDefault = @IsDefault,
                a.MinLoginIntervalMs = @MinLoginIntervalMs
            FROM mailq.SendingAccount AS a
            WHERE a.AccountName = @AccountName;
        ELSE
            INSERT INTO mailq.SendingAccount (
                AccountName, DefaultFromAddress, DefaultFromName,
                PerMinuteLimit, PerHourLimit, PerDayLimit, IsDefault, MinLoginIntervalMs
            )
            VALUES (
                @AccountName, LTRIM(RTRIM(@DefaultFromAddress)), @DefaultFromName,
                @PerMinuteLimit, @PerHourLimit, @PerDayLimit, @IsDefault, @MinLoginIntervalMs
            );

        IF NOT EXISTS (SELECT 1 FROM mailq.RateBudget AS b WHERE b.AccountName = @AccountName)
            INSERT INTO mailq.RateBudget (AccountName) VALUES (@AccountName);

        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        -- Roll back only what we opened: a caller's transaction is doomed by
        -- XACT_ABORT and rolled back by the caller (@@TRANCOUNT stays as on entry).
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
