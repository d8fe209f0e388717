/*
mailq.CheckClaimRequest (internal: mailq.ClaimMail's parameter checks, before its
transaction; granted to nobody, reached through ownership chaining).
Parameters:  ClaimMail's, same names and types, defaults already applied:
             @BatchSize INT, @LockToken UNIQUEIDENTIFIER, @LeaseSeconds INT,
             @AppName, @WorkerName NVARCHAR(4000), @AccountNames NVARCHAR(MAX),
             @RunModes NVARCHAR(MAX) (NULL already made ["prod"]).
Result set:  none.
Errors:      ClaimMail's 50130 @BatchSize, 50131 @LockToken, 50132 @LeaseSeconds,
             50103 a name over 128, 50115 @AppName not registered, 50148 @AccountNames,
             50241 @RunModes, in that order; THROW under XACT_ABORT ON, as in ClaimMail.
Transaction: none of its own; writes nothing (inside the caller's, if one is open).
Isolation:   READ COMMITTED (as ClaimMail); one plain read of mailq.Application.
Lock order:  mailq.Application only (shared, statement-long).
Example:     EXEC mailq.CheckClaimRequest @BatchSize = 10, @LockToken = @T, @LeaseSeconds = 300,
                 @AppName = NULL, @WorkerName = NULL, @AccountNames = NULL, @RunModes = N'["prod"]';
*/
CREATE OR ALTER PROCEDURE mailq.CheckClaimRequest
    @BatchSize INT,
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT,
    @AppName NVARCHAR(4000),
    @WorkerName NVARCHAR(4000),
    @AccountNames NVARCHAR(MAX),
    @RunModes NVARCHAR(MAX)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50130, @Msg, 1;
    END;
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: a new GUID per claimed batch.', 1;
    IF @LeaseSeconds NOT BETWEEN 1 AND 3600
    BEGIN
        SET @Msg = CONCAT(N'@LeaseSeconds must be 1-3600; got ', @LeaseSeconds, N'.');
        THROW 50132, @Msg, 1;
    END;
    IF LEN(@AppName) > 128 OR LEN(@WorkerName) > 128
        THROW 50103, N'@AppName and @WorkerName are limited to 128 characters.', 1;
    IF @AppName IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(N'@AppName ''', @AppName, N''' is not a registered application.');
        THROW 50115, @Msg, 1;
    END;
    -- Separate statements, not one OR: ISJSON/OPENJSON evaluation order is not guaranteed.
    DECLARE @AccountsOk BIT = 1;
    IF @AccountNames IS NOT NULL
    BEGIN
        IF ISJSON(@AccountNames) = 0 OR LEFT(LTRIM(@AccountNames), 1) <> N'['
            SET @AccountsOk = 0;
        ELSE IF EXISTS (SELECT 1 FROM OPENJSON(@AccountNames) AS j WHERE j.[type] <> 1)
            SET @AccountsOk = 0;
    END;
    IF @AccountsOk = 0
        THROW 50148, N'@AccountNames must be a JSON array of account names, e.g. ["default", "overseas"].', 1;
    DECLARE @RunModesOk BIT = 1;
    IF ISJSON(@RunModes) = 0 OR LEFT(LTRIM(@RunModes), 1) <> N'['
        SET @RunModesOk = 0;
    ELSE IF (SELECT COUNT(*) FROM OPENJSON(@RunModes)) NOT BETWEEN 1 AND 16
        SET @RunModesOk = 0;
    ELSE IF EXISTS (
        SELECT 1
        FROM OPENJSON(@RunModes) AS j
        WHERE
            j.[type] <> 1
            OR LEN(j.[value]) NOT BETWEEN 1 AND 32
            OR j.[value] COLLATE Latin1_General_100_BIN2 NOT LIKE N'[a-z]%'
            OR j.[value] COLLATE Latin1_General_100_BIN2 LIKE N'%[^a-z0-9_-]%'
    )
        SET @RunModesOk = 0;
    IF @RunModesOk = 0
    BEGIN
        SET @Msg = CONCAT(
            N'@RunModes must be a JSON array of 1-16 run-mode names (a-z first, then a-z 0-9 - _, ',
            N'at most 32 characters), e.g. ["prod"] or ["staging", "test"].'
        );
        THROW 50241, @Msg, 1;
    END;
END;
