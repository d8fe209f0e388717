/*
mailq.BindApplication: lets an application send through an account and/or as a From address or
'@domain', and/or maps a database user to it (a user mapped elsewhere moves); idempotent.
Parameters:  @AppName, required; at least one of @AccountName, @FromAddress (one bare address or
             '@example.com', stored lower case) and @PrincipalName (a user whose mail carries @AppName).
Errors:      50145 @AppName missing; 50115 unknown application; 50114 unknown account; 50164
             nothing to bind; 50165 bad @FromAddress; 50169 @PrincipalName is not a user.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.ApplicationAccount, mailq.ApplicationFrom, mailq.ApplicationPrincipal.
Example:     EXEC mailq.BindApplication @AppName = N'billing', @FromAddress = N'@billing.example.com';
*/
CREATE OR ALTER PROCEDURE mailq.BindApplication
    @AppName NVARCHAR(4000),
    @AccountName NVARCHAR(4000) = NULL,
    @FromAddress NVARCHAR(4000) = NULL,
    @PrincipalName NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AppName)), N'') IS NULL
        THROW 50145, N'@AppName is required.', 1;
    IF @AccountName IS NULL AND @FromAddress IS NULL AND @PrincipalName IS NULL
        THROW 50164, N'Give @AccountName, @FromAddress and/or @PrincipalName: what to bind.', 1;
    IF NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(
            N'@AppName ''', LEFT(@AppName, 128), N''' is not a registered application (mailq.UpsertApplication).'
        );
        THROW 50115, @Msg, 1;
    END;
    IF
        @AccountName IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @AccountName)
    BEGIN
        SET @Msg = CONCAT(N'@AccountName ''', LEFT(@AccountName, 128), N''' is not a sending account.');
        THROW 50114, @Msg, 1;
    END;
    IF
        @PrincipalName IS NOT NULL
        AND NOT EXISTS (
            SELECT 1
            FROM sys.database_principals AS d
            WHERE d.name = @PrincipalName AND d.type IN ('S', 'U', 'E', 'X', 'C', 'K')  -- users: USER_NAME()
        )
    BEGIN
        SET @Msg = CONCAT(N'@PrincipalName ''', LEFT(@PrincipalName, 128), N''' is not a database user.');
        THROW 50169, @Msg, 1;
    END;
    DECLARE @Pattern NVARCHAR(320);
    IF @FromAddress IS NOT NULL
    BEGIN
        SET @Pattern = LOWER(LTRIM(RTRIM(@FromAddress)));
        DECLARE @Probe NVARCHAR(4000) = IIF(LEFT(@Pattern, 1) = N'@', N'x' + @Pattern, @Pattern);
        IF
            LEN(@FromAddress) > 320
            OR (SELECT COUNT(*) FROM mailq.ParseAddressList(@Probe)) <> 1
            OR EXISTS (
                SELECT 1
                FROM mailq.ParseAddressList(@Probe) AS a
                WHERE a.Problem IS NOT NULL OR a.DisplayName IS NOT NULL
            )
        BEGIN
            SET @Msg = CONCAT(
                N'@FromAddress must be one bare address or a domain written @example.com; got ''',
                LEFT(@FromAddress, 100), N'''.'
            );
            THROW 50165, @Msg, 1;
        END;
    END;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK, HOLDLOCK: admin-only tables; their range locks never meet the enqueue path.
        IF
            @AccountName IS NOT NULL
            AND NOT EXISTS (
                SELECT 1
                FROM mailq.ApplicationAccount AS b WITH (UPDLOCK, HOLDLOCK)
                WHERE b.AppName = @AppName AND b.AccountName = @AccountName
            )
            INSERT INTO mailq.ApplicationAccount (AppName, AccountName)
            VALUES (@AppName, @AccountName);
        IF
            @Pattern IS NOT NULL
            AND NOT EXISTS (
                SELECT 1
                FROM mailq.ApplicationFrom AS f WITH (UPDLOCK, HOLDLOCK)
                WHERE f.AppName = @AppName AND f.FromPattern = @Pattern
            )
            INSERT INTO mailq.ApplicationFrom (AppName, FromPattern)
            VALUES (@AppName, @Pattern);
        IF @PrincipalName IS NOT NULL
        BEGIN
            UPDATE u
            SET u.AppName = @AppName
            FROM mailq.ApplicationPrincipal AS u WITH (UPDLOCK, HOLDLOCK)
            WHERE u.PrincipalName = @PrincipalName;
            IF @@ROWCOUNT = 0
                INSERT INTO mailq.ApplicationPrincipal (PrincipalName, AppName)
                VALUES (@PrincipalName, @AppName);
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
