/*
mailq.GetMailEvents: reads the event stream (mailq.MailEvent) after a
cursor, in EventID order, in bounded batches: one application's events
(@AppName) or one mail's (@MailID).  The caller keeps the last EventID it
processed and passes it back as @AfterEventID.
Commit-safe cursor: EventID is the row's ROWVERSION as BIGINT, and only
rows below MIN_ACTIVE_ROWVERSION() are returned.  "A rowversion value is
active if it is used in a transaction that has not yet been committed"; the
function returns the lowest active value, or @@DBTS + 1 when none is
(MIN_ACTIVE_ROWVERSION (Transact-SQL), Remarks:
https://learn.microsoft.com/sql/t-sql/functions/min-active-rowversion-transact-sql).
So every event returned belongs to an ended transaction, and any event that
commits later carries a higher EventID than every one returned: a reader
never skips one.  The price: any open transaction that has written a
rowversion value in this database holds back every reader until it ends: one
that wrote an event (e.g. an enqueue inside an application's own long
transaction), and equally one that inserted or updated a row of any other
table with a rowversion column (the counter is the database's, not the
table's); events are delayed, never lost.  An abandoned or in-doubt (MSDTC)
transaction stalls the stream until it is ended: MIN_ACTIVE_ROWVERSION()
staying below @@DBTS + 1 shows it.
The bound is read into a variable first, and the rows are read with
READCOMMITTEDLOCK in a later statement: under READ_COMMITTED_SNAPSHOT a
statement's snapshot could predate a commit below the bound; a locking read
cannot (rows below the bound are committed, so it never waits on them).
Parameters:  @AppName NVARCHAR(128) or @MailID BIGINT: exactly one;
             @AfterEventID BIGINT >= 0, default 0 (from the start);
             @MaxEvents INT 1-5000, default 500.
Result set:  up to @MaxEvents rows in EventID order: EventID BIGINT, MailID
             BIGINT, AppName NVARCHAR(128), EventType NVARCHAR(32), Status
             NVARCHAR(16), AttemptCount INT, SmtpCode INT, Detail
             NVARCHAR(4000), OccurredAtUtc DATETIME2(3).  Fewer rows than
             @MaxEvents: the caller is up to date (for now).
Errors:      50170 neither or both of @AppName / @MailID; 50171 @AfterEventID
             NULL or negative; 50172 @MaxEvents out of range; 50173 the calling
             database user is mapped to another application
             (mailq.ApplicationPrincipal) than @AppName.
Access:      a database user mapped to an application reads only that
             application's events (by @MailID too: other mails' events are
             filtered out); other callers of the procedure read every
             application's (grants: MailqEnqueuer, MailqAdmin).
Transaction: opens none and writes nothing; inside a caller's transaction
             that has itself written events, the bound stops below them.
Isolation:   sets READ COMMITTED itself and reads with READCOMMITTEDLOCK (see
             above); a level set in a procedure reverts when it returns.
Lock order:  mailq.MailEvent only (shared locks, released row by row).  Only
             mailq.PurgeMail changes rows below the bound: a reader of the
             events it is deleting waits for that purge batch, and (a key
             lookup against the delete's index order) can be the deadlock
             victim (1205): retry the call with the same cursor.
Plan:        a range seek on IX_MailEvent_AppName (AppName, EventSeq) or
             IX_MailEvent_MailID (MailID, EventSeq) between the cursor and
             the bound, TOP (@MaxEvents), key lookups for the rows returned:
             the same cost at any table size.
Example:     EXEC mailq.GetMailEvents @AppName = N'billing', @AfterEventID = 41230, @MaxEvents = 500;
*/
CREATE OR ALTER PROCEDURE mailq.GetMailEvents
    @AppName NVARCHAR(128) = NULL,
    @MailID BIGINT = NULL,
    @AfterEventID BIGINT = 0,
    @MaxEvents INT = 500
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

    DECLARE @Msg NVARCHAR(2048);
    IF (@AppName IS NULL AND @MailID IS NULL) OR (@AppName IS NOT NULL AND @MailID IS NOT NULL)
        THROW 50170, N'Pass exactly one of @AppName and @MailID.', 1;
    IF @AfterEventID IS NULL OR @AfterEventID < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@AfterEventID must be 0 or an EventID already read; got ',
            COALESCE(CAST(@AfterEventID AS NVARCHAR(24)), N'NULL'), N'.'
        );
        THROW 50171, @Msg, 1;
    END;
    SET @MaxEvents = COALESCE(@MaxEvents, 500);
    IF @MaxEvents NOT BETWEEN 1 AND 5000
    BEGIN
        SET @Msg = CONCAT(N'@MaxEvents must be 1-5000; got ', @MaxEvents, N'.');
        THROW 50172, @Msg, 1;
    END;

    -- A user mapped to an application reads that application only.
    DECLARE @PrincipalApp NVARCHAR(128) = (
        SELECT u.AppName FROM mailq.ApplicationPrincipal AS u WHERE u.PrincipalName = USER_NAME()
    );
    IF @PrincipalApp IS NOT NULL AND @AppName IS NOT NULL AND @AppName <> @PrincipalApp
    BEGIN
        SET @Msg = CONCAT(
            N'Database user ', QUOTENAME(USER_NAME()), N' reads the events of application ''', @PrincipalApp,
            N''' only; got @AppName ''', @AppName, N'''.'
        );
        THROW 50173, @Msg, 1;
    END;

    -- BIGINT -> BINARY(8) is big-endian, the order rowversion values compare in.
    DECLARE @After BINARY(8) = CAST(@AfterEventID AS BINARY(8));
    -- The bound first, in its own statement (see the header).
    DECLARE @Upper BINARY(8) = MIN_ACTIVE_ROWVERSION();

    IF @AppName IS NOT NULL
        SELECT TOP (@MaxEvents)
            CAST(e.EventSeq AS BIGINT) AS EventID,
            e.MailID,
            e.AppName,
            e.EventType,
            e.Status,
            e.AttemptCount,
            e.SmtpCode,
            e.Detail,
            e.OccurredAtUtc
        -- FORCESEEK on the (AppName, EventSeq) range; READCOMMITTEDLOCK: see the header.
        FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_AppName), FORCESEEK, READCOMMITTEDLOCK)
        WHERE e.AppName = @AppName AND e.EventSeq > @After AND e.EventSeq < @Upper
        ORDER BY e.EventSeq ASC;
    ELSE
        SELECT TOP (@MaxEvents)
            CAST(e.EventSeq AS BIGINT) AS EventID,
            e.MailID,
            e.AppName,
            e.EventType,
            e.Status,
            e.AttemptCount,
            e.SmtpCode,
            e.Detail,
            e.OccurredAtUtc
        -- FORCESEEK on the (MailID, EventSeq) range; READCOMMITTEDLOCK: see the header.
        FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_MailID), FORCESEEK, READCOMMITTEDLOCK)
        WHERE
            e.MailID = @MailID AND e.EventSeq > @After AND e.EventSeq < @Upper
            AND (@PrincipalApp IS NULL OR e.AppName = @PrincipalApp)
        ORDER BY e.EventSeq ASC;
END;
