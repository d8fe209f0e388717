/*
mailq.GetMailEvents: the event stream of one application or one mail after a cursor, in EventID
order, in bounded batches; commit-safe: only events below MIN_ACTIVE_ROWVERSION() (docs/events.md).
Parameters:  @AppName or @MailID, exactly one; @AfterEventID BIGINT >= 0, default 0; @MaxEvents 1-5000, default 500.
Result set:  EventID, MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail,
             OccurredAtUtc; fewer than @MaxEvents rows: up to date (for now).
Errors:      50170 not exactly one of @AppName / @MailID; 50171 @AfterEventID; 50172 @MaxEvents;
             50173 the caller is mapped to another application (a mapped user reads only its own).
Transaction: opens none.  Isolation: sets READ COMMITTED; the bound first, rows READCOMMITTEDLOCK.
Lock order:  mailq.MailEvent only (shared); a PurgeMail batch may make it a 1205 victim: call again.
Example:     EXEC mailq.GetMailEvents @AppName = N'billing', @AfterEventID = 41230;
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
    DECLARE @After BINARY(8) = CAST(@AfterEventID AS BINARY(8));  -- big-endian, as rowversions compare
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
        FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_MailID), FORCESEEK, READCOMMITTEDLOCK)
        WHERE
            e.MailID = @MailID AND e.EventSeq > @After AND e.EventSeq < @Upper
            AND (@PrincipalApp IS NULL OR e.AppName = @PrincipalApp)
        ORDER BY e.EventSeq ASC;
END;
