/*
mailq.CheckBounceReport (internal: mailq.RecordBounce's parameter checks, before its
transaction; granted to nobody, reached through ownership chaining): validates one
report's parameters and resolves the mail its VERP token names.
Parameters:  RecordBounce's @ReportKey, @Recipients, @Source, @AccountName, @MailID,
             @RecipientNo, @HardBounceLimit (already defaulted), @SoftBounceLimit;
             OUTPUT: @KnownMail (NULL: no queued mail), @Account (the mail's, else
             @AccountName), @App, @To, @CC, @BCC (the mail's lists), @TokenAddress
             (the address @RecipientNo names in a known mail, else NULL).
Result set:  none.
Errors:      RecordBounce's 50607, 50604, 50610, 50609, 50601, in that order.
Transaction: none of its own; writes nothing (inside the caller's, if one is open).
Isolation:   READ COMMITTED (as RecordBounce); plain reads of the mail and account.
Lock order:  mailq.MailQueue, mailq.SendingAccount (shared, statement-long).
Example:     EXEC mailq.CheckBounceReport @ReportKey = @ReportKey, ..., @KnownMail = @KnownMail OUTPUT, ...;
*/
CREATE OR ALTER PROCEDURE mailq.CheckBounceReport
    @ReportKey VARBINARY(32),
    @Recipients NVARCHAR(MAX),
    @Source NVARCHAR(200),
    @AccountName NVARCHAR(128),
    @MailID BIGINT,
    @RecipientNo INT,
    @HardBounceLimit INT,
    @SoftBounceLimit INT,
    @KnownMail BIGINT OUTPUT,
    @Account NVARCHAR(128) OUTPUT,
    @App NVARCHAR(128) OUTPUT,
    @To NVARCHAR(4000) OUTPUT,
    @CC NVARCHAR(4000) OUTPUT,
    @BCC NVARCHAR(4000) OUTPUT,
    @TokenAddress NVARCHAR(320) OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SELECT @KnownMail = NULL, @Account = NULL, @App = NULL, @To = NULL, @CC = NULL, @BCC = NULL,
        @TokenAddress = NULL;
    IF @ReportKey IS NULL OR DATALENGTH(@ReportKey) <> 32
        THROW 50607, N'@ReportKey must be 32 bytes: the SHA-256 of the report''s Message-ID (or of its bytes).', 1;
    IF NULLIF(LTRIM(RTRIM(@Source)), N'') IS NULL
        THROW 50604, N'@Source is required (1-200 characters): where the report was read.', 1;
    IF @HardBounceLimit NOT BETWEEN 1 AND 100 OR @SoftBounceLimit NOT BETWEEN 1 AND 100
    BEGIN
        SET @Msg = CONCAT(N'@HardBounceLimit must be 1-100 and @SoftBounceLimit 1-100 or NULL; got ',
            @HardBounceLimit, N' and ', COALESCE(CAST(@SoftBounceLimit AS NVARCHAR(12)), N'NULL'), N'.');
        THROW 50610, @Msg, 1;
    END;
    -- ISJSON, OPENJSON and JSON_VALUE in separate statements (no guaranteed
    -- evaluation order inside one condition).
    DECLARE @RecipientsOk BIT = 1;
    IF @Recipients IS NULL OR ISJSON(@Recipients) = 0 OR LEFT(LTRIM(@Recipients), 1) <> N'['
        SET @RecipientsOk = 0;
    ELSE IF (SELECT COUNT(*) FROM OPENJSON(@Recipients)) NOT BETWEEN 1 AND 1000
        SET @RecipientsOk = 0;
    ELSE IF EXISTS (SELECT 1 FROM OPENJSON(@Recipients) AS j WHERE j.[type] <> 5)
        SET @RecipientsOk = 0;
    IF @RecipientsOk = 0
        THROW 50609, N'@Recipients must be a JSON array of 1-1000 objects.', 1;
    -- The mail, when the token named one that still exists (a plain read:
    -- account, application and lists do not change after enqueue except by
    -- a suppression sweep, which only removes addresses).
    IF @MailID IS NOT NULL
        SELECT
            @KnownMail = q.ID, @Account = q.AccountName, @App = q.AppName,
            @To = q.ToAddress, @CC = q.CC, @BCC = q.BCC
        FROM mailq.MailQueue AS q
        WHERE q.ID = @MailID;
    IF @KnownMail IS NULL
    BEGIN
        SET @Account = @AccountName;
        IF @Account IS NULL OR NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @Account)
        BEGIN
            SET @Msg = CONCAT(N'@AccountName ''', @AccountName, N''' is not a sending account, and the report ',
                N'names no queued mail (@MailID ', @MailID, N'): give the account the bounce mailbox serves.');
            THROW 50601, @Msg, 1;
        END;
    END;
    SET @TokenAddress = (
        SELECT TOP (1) CAST(r.Address AS NVARCHAR(320))
        FROM mailq.MailRecipientList(@To, @CC, @BCC) AS r
        WHERE r.RecipientNo = @RecipientNo AND r.IsFirst = 1 AND @KnownMail IS NOT NULL
    );
END;
