/*
mailq.GetRecipientOutcomes: the recorded recipient outcomes of leased mails, so a
new attempt skips recipients Delivered or Refused; mails not leased under
@LockToken are left out (no error: the next fenced call finds out).
Parameters:  @IDList NVARCHAR(MAX) (JSON array of 1-1000), @LockToken UNIQUEIDENTIFIER
Result set:  one row per recorded recipient: MailID, Address, Outcome,
             SmtpCode, SmtpText, AttemptNo, UpdatedAtUtc.
Errors:      50131 @LockToken missing; 50185 @IDList not a JSON array of 1-1000 integers.
Transaction: reads only; none of its own.
Isolation:   READ COMMITTED, set here (no lock kept for a SERIALIZABLE caller).
Lock order:  mailq.MailQueue, then mailq.MailRecipientOutcome (shared, row by row).
Example:     EXEC mailq.GetRecipientOutcomes @IDList = N'[101,102]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.GetRecipientOutcomes
    @IDList NVARCHAR(MAX),
    @LockToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;  -- reverts when the procedure returns
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: the token the mails were claimed with.', 1;
    -- Separate statements: OR has no guaranteed order, so OPENJSON could meet
    -- non-JSON and raise 13609 instead of 50185.
    DECLARE @IDListOk BIT = 1;
    IF @IDList IS NULL OR ISJSON(@IDList) = 0 OR LEFT(LTRIM(@IDList), 1) <> N'['
        SET @IDListOk = 0;
    ELSE IF EXISTS (
        SELECT 1
        FROM OPENJSON(@IDList) AS j
        WHERE j.[type] <> 2 OR TRY_CAST(j.[value] AS BIGINT) IS NULL
    )
        SET @IDListOk = 0;
    ELSE IF (SELECT COUNT(*) FROM OPENJSON(@IDList)) NOT BETWEEN 1 AND 1000
        SET @IDListOk = 0;
    IF @IDListOk = 0
        THROW 50185, N'@IDList must be a JSON array of 1-1000 integer mail IDs, e.g. [101, 102].', 1;
    SELECT
        o.MailID,
        o.Address,
        o.Outcome,
        o.SmtpCode,
        o.SmtpText,
        o.AttemptNo,
        o.UpdatedAtUtc
    FROM mailq.ParseIDList(NULL, @IDList) AS l
    INNER JOIN mailq.MailQueue AS q ON l.ID = q.ID
    INNER JOIN mailq.MailRecipientOutcome AS o ON q.ID = o.MailID
    WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken
    ORDER BY o.MailID, o.Address;
END;
