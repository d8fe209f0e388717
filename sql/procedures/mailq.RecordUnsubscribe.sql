/*
mailq.RecordUnsubscribe: a recipient asked for no more of this mail's stream
(RFC 8058 one-click POST, or List-Unsubscribe mailto: read by the bounce reader;
the caller verified the signed token): suppresses the address for the mail's
application (the whole account when it has none), records a mailq.BounceReport
row (Kind Unsubscribe) and the event Unsubscribed.  Idempotent per (mail,
recipient); re-applies the suppression only if an operator removed it since.
Parameters:  @MailID BIGINT, required; @RecipientNo INT, required: 1-based
             (mailq.MailRecipientList); @Source NVARCHAR(200), required.
Result set:  one row: MailID, AccountName, AppName, Address, Recorded BIT (0:
             already unsubscribed from this mail).
Errors:      50604 @Source missing or over 200 characters; 50611 no such mail
             (unknown, or purged: docs/bounces.md); 50612 @RecipientNo not a
             recipient number of that mail.
Transaction: its own if none is open, else the caller's; an error dooms either.
Isolation:   READ COMMITTED; the report key WITH (UPDLOCK, HOLDLOCK): two clicks
             record one unsubscribe.
Lock order:  mailq.BounceReport, then mailq.ApplySuppressions's order, then mailq.MailEvent.
Example:     EXEC mailq.RecordUnsubscribe @MailID = 101, @RecipientNo = 1, @Source = N'unsubscribe-url';
*/
CREATE OR ALTER PROCEDURE mailq.RecordUnsubscribe
    @MailID BIGINT,
    @RecipientNo INT,
    @Source NVARCHAR(200)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@Source)), N'') IS NULL
        THROW 50604, N'@Source is required (1-200 characters): how the unsubscribe arrived.', 1;
    DECLARE @Account NVARCHAR(128), @App NVARCHAR(128), @To NVARCHAR(4000), @CC NVARCHAR(4000),
        @BCC NVARCHAR(4000), @Known BIGINT, @Status NVARCHAR(16), @AttemptCount INT;
    SELECT
        @Known = q.ID, @Account = q.AccountName, @App = q.AppName,
        @To = q.ToAddress, @CC = q.CC, @BCC = q.BCC
    FROM mailq.MailQueue AS q
    WHERE q.ID = @MailID;
    IF @Known IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'Mail ', @MailID, N' does not exist (purged?): the unsubscribe cannot be tied to an address.'
        );
        THROW 50611, @Msg, 1;
    END;
    -- Tokens name a recipient only for a mail with one recipient (number 1):
    -- a sweep never renumbers such a mail (it stops it instead).
    DECLARE @Address NVARCHAR(320) = (
        SELECT TOP (1) CAST(r.Address AS NVARCHAR(320))
        FROM mailq.MailRecipientList(@To, @CC, @BCC) AS r
        WHERE r.RecipientNo = @RecipientNo AND r.IsFirst = 1 AND LEN(r.Address) <= 320
    );
    IF @Address IS NULL
    BEGIN
        SET @Msg = CONCAT(N'@RecipientNo ', COALESCE(CAST(@RecipientNo AS NVARCHAR(12)), N'NULL'),
            N' is not a recipient number of mail ', @MailID, N'.');
        THROW 50612, @Msg, 1;
    END;
    DECLARE @Key VARBINARY(32) = HASHBYTES('SHA2_256', CONCAT(N'unsubscribe:', @MailID, N':', @RecipientNo));
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Recorded BIT = 0;
    DECLARE @Suppressions NVARCHAR(MAX);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        INSERT INTO mailq.BounceReport (
            ReportKey, Address, AccountName, AppName, MailID, Kind, Action, Status, SmtpCode, Detail, Source,
            ReceivedAtUtc
        )
        SELECT @Key, @Address, @Account, @App, @MailID, N'Unsubscribe', NULL, NULL, NULL, NULL, @Source, @Now
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.BounceReport AS b WITH (UPDLOCK, HOLDLOCK)
            WHERE b.ReportKey = @Key AND b.Address = @Address
        );
        SET @Recorded = IIF(@@ROWCOUNT = 1, 1, 0);
        IF @Recorded = 1 OR NOT EXISTS (
            SELECT 1
            FROM mailq.Suppression AS s
            WHERE
                s.AccountName = @Account AND s.Address = @Address AND s.AppName IN (N'', ISNULL(@App, N''))
                AND (s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @Now)
        )
        BEGIN
            SET @Suppressions = (
                SELECT
                    @Account AS AccountName,
                    @Address AS Address,
                    @App AS AppName,
                    N'Unsubscribe' AS Reason,
                    @Source AS Source,
                    CONCAT(N'unsubscribed from mail ', @MailID) AS Detail,
                    @MailID AS MailID
                FOR JSON PATH
            );
            EXEC mailq.ApplySuppressions @Suppressions = @Suppressions;
        END;
        IF @Recorded = 1
        BEGIN
            SELECT @Status = q.Status, @AttemptCount = q.AttemptCount
            FROM mailq.MailQueue AS q
            WHERE q.ID = @MailID;
            INSERT INTO mailq.MailEvent (
                MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc
            )
            VALUES (
                @MailID, @App, N'Unsubscribed', @Status, @AttemptCount, NULL,
                LEFT(CONCAT(@Address, N' (', @Source, N')'), 4000), @Now
            );
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT @MailID AS MailID, @Account AS AccountName, @App AS AppName, @Address AS Address, @Recorded AS Recorded;
END;
