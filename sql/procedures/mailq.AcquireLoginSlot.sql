/*
mailq.AcquireLoginSlot: grants a worker's SMTP login to an account (stamping LastLoginAtUtc) or
says how long to wait, so logins on one account stay MinLoginIntervalMs apart across all workers.
Parameters:  @AccountName NVARCHAR(128), required: an existing sending account.
Result set:  one row: Granted BIT, WaitMs INT (0 when granted), MinLoginIntervalMs, LastLoginAtUtc.
Errors:      50123 @AccountName missing; 50103 over 128 characters; 50270 no such account.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED;
             one UPDATE by key (U-locked, also under RCSI) decides and stamps: never two grants.
Lock order:  mailq.SendingAccount only (one row).  Example: EXEC mailq.AcquireLoginSlot @AccountName = N'qq';
*/
CREATE OR ALTER PROCEDURE mailq.AcquireLoginSlot
    @AccountName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50123, N'@AccountName is required: the sending account the worker is about to log in to.', 1;
    IF LEN(@AccountName) > 128
        THROW 50103, N'@AccountName is over its size (128).', 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Slot TABLE (
        MinLoginIntervalMs INT NULL,
        PreviousLoginAtUtc DATETIME2(3) NULL,
        LastLoginAtUtc DATETIME2(3) NULL
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- Granted also when the stamp lies more than one interval ahead (the clock went back).
        UPDATE a
        SET a.LastLoginAtUtc = IIF(
            a.MinLoginIntervalMs IS NULL
            OR a.LastLoginAtUtc IS NULL
            OR a.LastLoginAtUtc <= DATEADD(MILLISECOND, -a.MinLoginIntervalMs, @Now)
            OR a.LastLoginAtUtc > DATEADD(MILLISECOND, a.MinLoginIntervalMs, @Now),
            @Now,
            a.LastLoginAtUtc
        )
        OUTPUT inserted.MinLoginIntervalMs, deleted.LastLoginAtUtc, inserted.LastLoginAtUtc
        INTO @Slot (MinLoginIntervalMs, PreviousLoginAtUtc, LastLoginAtUtc)
        FROM mailq.SendingAccount AS a
        WHERE a.AccountName = @AccountName;
        IF NOT EXISTS (SELECT 1 FROM @Slot)
        BEGIN
            SET @Msg = CONCAT(
                N'@AccountName ''', LEFT(@AccountName, 128),
                N''' is not a sending account (create it with mailq.UpsertSendingAccount).'
            );
            THROW 50270, @Msg, 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    -- DATEDIFF_BIG: a stamp far from @Now must not overflow INT before the cap.
    WITH Decided AS (
        SELECT
            s.MinLoginIntervalMs,
            s.LastLoginAtUtc,
            CAST(IIF(
                s.MinLoginIntervalMs IS NULL
                OR s.PreviousLoginAtUtc IS NULL
                OR s.PreviousLoginAtUtc <= DATEADD(MILLISECOND, -s.MinLoginIntervalMs, @Now)
                OR s.PreviousLoginAtUtc > DATEADD(MILLISECOND, s.MinLoginIntervalMs, @Now),
                1, 0
            ) AS BIT) AS Granted,
            DATEDIFF_BIG(
                MILLISECOND, @Now, DATEADD(MILLISECOND, s.MinLoginIntervalMs, s.PreviousLoginAtUtc)
            ) AS LeftMs
        FROM @Slot AS s
    )

    SELECT
        d.Granted,
        CAST(IIF(
            d.Granted = 1, 0,
            IIF(d.LeftMs > d.MinLoginIntervalMs, d.MinLoginIntervalMs, IIF(d.LeftMs < 1, 1, d.LeftMs))
        ) AS INT) AS WaitMs,
        d.MinLoginIntervalMs,
        d.LastLoginAtUtc
    FROM Decided AS d;
END;
