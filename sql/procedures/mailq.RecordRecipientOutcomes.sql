/*
mailq.RecordRecipientOutcomes: records which recipients of a leased mail were
accepted (Delivered), refused for now (Deferred, 4xx) or for good (Refused, 5xx),
before MarkSent or MarkFailed 'Retry': the next attempt sends only to recipients
neither Delivered nor Refused (mailq.GetRecipientOutcomes).
Parameters:  @ID BIGINT, @LockToken UNIQUEIDENTIFIER, required (the lease fence)
             @Outcomes NVARCHAR(MAX), required: JSON array of 1-1000 {"address",
             "outcome": "Delivered"|"Deferred"|"Refused", "code": 200-599 or null,
             "text": up to 1000 characters}
Result set:  none.
Errors:      50180 @ID missing; 50181 @Outcomes malformed or an address not 1-320
             characters; 50182 unknown outcome; 50183 code not 200-599; 50184 an
             address twice; 50131, 50201-50203 (mailq.LockLeasedMail).
Transaction: its own or the caller's; an error writes nothing, dooms it, is re-raised.
Isolation:   READ COMMITTED, set here; the mail row's UPDLOCK serializes every
             writer of its recipients, also under RCSI.
Lock order:  mailq.MailQueue (the mail row), then mailq.MailRecipientOutcome.
Example:     EXEC mailq.RecordRecipientOutcomes @ID = 101, @LockToken = @T,
                 @Outcomes = N'[{"address":"a@example.com","outcome":"Delivered","code":250}]';
*/
CREATE OR ALTER PROCEDURE mailq.RecordRecipientOutcomes
    @ID BIGINT,
    @LockToken UNIQUEIDENTIFIER,
    @Outcomes NVARCHAR(MAX)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;  -- reverts when the procedure returns
    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50180, N'@ID is required: the mail whose recipients are recorded.', 1;
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: the token the mail was claimed with.', 1;
    -- Separate statements: OR has no guaranteed order, so OPENJSON could meet
    -- non-JSON and raise 13609 instead of 50181.
    DECLARE @OutcomesOk BIT = 1;
    IF @Outcomes IS NULL OR ISJSON(@Outcomes) = 0 OR LEFT(LTRIM(@Outcomes), 1) <> N'['
        SET @OutcomesOk = 0;
    ELSE IF (SELECT COUNT(*) FROM OPENJSON(@Outcomes)) NOT BETWEEN 1 AND 1000
        SET @OutcomesOk = 0;
    ELSE IF EXISTS (SELECT 1 FROM OPENJSON(@Outcomes) AS j WHERE j.[type] <> 5)
        SET @OutcomesOk = 0;
    -- Lax JSON_VALUE: a missing or over-long address is NULL, and refused.
    ELSE IF EXISTS (
        SELECT 1
        FROM OPENJSON(@Outcomes) AS j
        WHERE ISNULL(LEN(JSON_VALUE(j.[value], N'$.address')), 0) NOT BETWEEN 1 AND 320
    )
        SET @OutcomesOk = 0;
    IF @OutcomesOk = 0
        THROW 50181,
            N'@Outcomes must be a JSON array of 1-1000 objects, each with an "address" of 1-320 characters.',
            1;
    DECLARE @Rows TABLE (
        Address NVARCHAR(320) NOT NULL,
        Outcome NVARCHAR(16) NULL,
        SmtpCode INT NULL,
        SmtpCodeText NVARCHAR(20) NULL,
        SmtpText NVARCHAR(1000) NULL
    );
    -- lax: a missing "code" or "text" (or one over 4000 characters) is NULL
    INSERT INTO @Rows (Address, Outcome, SmtpCode, SmtpCodeText, SmtpText)
    SELECT
        LOWER(JSON_VALUE(j.[value], N'$.address')),
        JSON_VALUE(j.[value], N'$.outcome'),
        TRY_CAST(JSON_VALUE(j.[value], N'$.code') AS INT),
        LEFT(JSON_VALUE(j.[value], N'$.code'), 20),
        LEFT(JSON_VALUE(j.[value], N'$.text'), 1000)
    FROM OPENJSON(@Outcomes) AS j;
    SELECT TOP (1) @Msg = CONCAT(N'@Outcomes: the outcome of ', r.Address, N' is ',
        COALESCE(N'"' + r.Outcome + N'"', N'missing'), N'; it must be Delivered, Deferred or Refused.')
    FROM @Rows AS r
    WHERE r.Outcome IS NULL OR r.Outcome NOT IN (N'Delivered', N'Deferred', N'Refused')
    ORDER BY r.Address;
    IF @Msg IS NOT NULL THROW 50182, @Msg, 1;
    SELECT TOP (1) @Msg = CONCAT(N'@Outcomes: the code of ', r.Address, N' is ', r.SmtpCodeText,
        N'; it must be an SMTP reply code 200-599 or null.')
    FROM @Rows AS r
    WHERE r.SmtpCodeText IS NOT NULL AND (r.SmtpCode IS NULL OR r.SmtpCode NOT BETWEEN 200 AND 599)
    ORDER BY r.Address;
    IF @Msg IS NOT NULL THROW 50183, @Msg, 1;
    SELECT TOP (1) @Msg = CONCAT(
        N'@Outcomes names ', r.Address, N' more than once (addresses compare case-insensitively).'
    )
    FROM @Rows AS r
    GROUP BY r.Address
    HAVING COUNT(*) > 1
    ORDER BY r.Address;
    IF @Msg IS NOT NULL THROW 50184, @Msg, 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @AttemptNo INT;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- the fence; the row stays UPDLOCKed until this transaction ends
        EXEC mailq.LockLeasedMail @ID = @ID, @LockToken = @LockToken;
        SELECT @AttemptNo = q.AttemptCount
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;
        -- a Delivered or Refused recipient is final: a later attempt never changes it
        UPDATE o
        SET
            o.Outcome = r.Outcome,
            o.SmtpCode = r.SmtpCode,
            o.SmtpText = r.SmtpText,
            o.AttemptNo = @AttemptNo,
            o.UpdatedAtUtc = @Now
        FROM mailq.MailRecipientOutcome AS o
        INNER JOIN @Rows AS r ON o.Address = r.Address
        WHERE o.MailID = @ID AND o.Outcome = N'Deferred';
        INSERT INTO mailq.MailRecipientOutcome (MailID, Address, Outcome, SmtpCode, SmtpText, AttemptNo, UpdatedAtUtc)
        SELECT
            @ID,
            r.Address,
            r.Outcome,
            r.SmtpCode,
            r.SmtpText,
            @AttemptNo,
            @Now
        FROM @Rows AS r
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.MailRecipientOutcome AS o
            WHERE o.MailID = @ID AND o.Address = r.Address
        );
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
