/*
mailq.LockLeasedMail: the fence of every acknowledgement (internal: ExtendLease,
ReleaseMail, MarkSent and MarkFailed call it in their transaction).  Locks the mails
WITH (UPDLOCK, ROWLOCK) until the caller's transaction ends and raises unless each
exists, is Sending and holds @LockToken: a reclaimed worker changes nothing.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array of 1-1000): exactly one;
             @LockToken UNIQUEIDENTIFIER, required; @AcceptSentByToken BIT = 0: 1
             also accepts a mail already Sent under @LockToken (a repeated MarkSent);
             @AcceptFailedByToken BIT = 0: 1 also accepts a repeated MarkFailed (the attempt
             under @LockToken ended Retry, Wait or Stop; reclaimed since or not; not Stopped)
Result set:  none.
Errors:      50131 @LockToken missing; 50136 neither or both of @ID/@IDList;
             50137 @IDList malformed; 50138 no open transaction; 50201 unknown
             mail; 50202 leased under another token; 50203 not Sending.
Transaction: the caller's only; an error dooms it (XACT_ABORT ON) and is re-raised.
Isolation:   READ COMMITTED, set here; the MailAttempt read is READCOMMITTEDLOCK.
Lock order:  mailq.MailQueue rows in the plan's order (overlapping lists under two
             tokens can deadlock, 1205), then mailq.MailAttempt.
Example:     EXEC mailq.LockLeasedMail @IDList = N'[1,2]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.LockLeasedMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @AcceptSentByToken BIT = 0,
    @AcceptFailedByToken BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @@TRANCOUNT = 0
        THROW 50138, N'mailq.LockLeasedMail must run inside the caller''s transaction.', 1;
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: the token the mails were claimed with.', 1;
    IF (@ID IS NULL AND @IDList IS NULL) OR (@ID IS NOT NULL AND @IDList IS NOT NULL)
        THROW 50136, N'Give exactly one of @ID (one mail) or @IDList (a JSON array of mail IDs).', 1;
    -- Separate statements: OR has no guaranteed order, so OPENJSON could meet
    -- non-JSON and raise 13609 instead of 50137.
    DECLARE @IDListOk BIT = 1;
    IF @IDList IS NOT NULL
    BEGIN
        IF ISJSON(@IDList) = 0 OR LEFT(LTRIM(@IDList), 1) <> N'['
            SET @IDListOk = 0;
        ELSE IF EXISTS (
            SELECT 1
            FROM OPENJSON(@IDList) AS j
            WHERE j.[type] <> 2 OR TRY_CAST(j.[value] AS BIGINT) IS NULL
        )
            SET @IDListOk = 0;
        ELSE IF (SELECT COUNT(*) FROM OPENJSON(@IDList)) NOT BETWEEN 1 AND 1000
            SET @IDListOk = 0;
    END;
    IF @IDListOk = 0
        THROW 50137, N'@IDList must be a JSON array of 1-1000 integer mail IDs, e.g. [101, 102].', 1;
    DECLARE @Held TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        Status NVARCHAR(16) NULL,
        ThreadLock UNIQUEIDENTIFIER NULL
    );
    -- UPDLOCK, ROWLOCK: the fence holds until the caller commits.  No READPAST:
    -- these rows must be seen.  FORCESEEK: OPENJSON's 50-row estimate may pick a
    -- scan, which would keep a U lock on every row read (deadlocks).
    INSERT INTO @Held (ID, Status, ThreadLock)
    SELECT l.ID, q.Status, q.ThreadLock
    FROM mailq.ParseIDList(@ID, @IDList) AS l
    LEFT JOIN mailq.MailQueue AS q WITH (FORCESEEK, UPDLOCK, ROWLOCK) ON l.ID = q.ID;
    SELECT TOP (1) @Msg = CONCAT(N'Mail ', h.ID, N' does not exist.')
    FROM @Held AS h
    WHERE h.Status IS NULL
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50201, @Msg, 1;
    -- A repeated MarkFailed passes (its caller changes only mails still Sending under the token):
    -- its attempt ended Retry/Wait/Stop (committed row); not a mail StopMail ended: 50203.
    IF @AcceptFailedByToken = 1
        DELETE h
        FROM @Held AS h
        WHERE
            (h.Status NOT IN (N'Sending', N'Stopped') OR h.ThreadLock <> @LockToken)
            AND EXISTS (
                SELECT 1
                FROM mailq.MailAttempt AS t WITH (READCOMMITTEDLOCK)
                WHERE t.MailID = h.ID AND t.LockToken = @LockToken AND t.Outcome IN (N'Retry', N'Wait', N'Stop')
            );
    SELECT TOP (1) @Msg = CONCAT(
        N'Mail ', h.ID, N' is ', h.Status, N', not Sending: it was already acknowledged, released or never claimed.'
    )
    FROM @Held AS h
    WHERE
        h.Status <> N'Sending'
        AND NOT (
            @AcceptSentByToken = 1
            AND h.Status = N'Sent'
            AND EXISTS (
                SELECT 1
                -- READCOMMITTEDLOCK: the committed row, never a version.
                FROM mailq.MailAttempt AS t WITH (READCOMMITTEDLOCK)
                WHERE t.MailID = h.ID AND t.LockToken = @LockToken AND t.Outcome IN (N'Sent', N'DryRun')
            )
        )
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50203, @Msg, 1;
    SELECT TOP (1) @Msg = CONCAT(
        N'Mail ', h.ID, N' is leased under another @LockToken: this worker''s lease expired and the mail ',
        N'was reclaimed; nothing was changed.'
    )
    FROM @Held AS h
    WHERE h.ThreadLock <> @LockToken
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50202, @Msg, 1;
END;
