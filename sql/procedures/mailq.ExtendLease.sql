/*
mailq.ExtendLease: pushes the leases a worker holds to now + @LeaseSeconds, fenced by the token, all or nothing.
Parameters:  @ID or @IDList (JSON array), exactly one; @LockToken, required; @LeaseSeconds 1-3600, default 300.
Result set:  ID, LeaseExpiresUtc, LeaseSecondsRemaining (INT, floored: count it down on the worker's clock).
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (mailq.LockLeasedMail); 50132 @LeaseSeconds.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.MailQueue only (via mailq.LockLeasedMail).
Example:     EXEC mailq.ExtendLease @IDList = N'[101,102]', @LockToken = @T, @LeaseSeconds = 300;
*/
CREATE OR ALTER PROCEDURE mailq.ExtendLease
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT = 300
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @LeaseSeconds = COALESCE(@LeaseSeconds, 300);
    IF @LeaseSeconds NOT BETWEEN 1 AND 3600
    BEGIN
        SET @Msg = CONCAT(N'@LeaseSeconds must be 1-3600; got ', @LeaseSeconds, N'.');
        THROW 50132, @Msg, 1;
    END;
    DECLARE @LeaseUntil DATETIME2(3) = DATEADD(SECOND, @LeaseSeconds, SYSUTCDATETIME());
    DECLARE @Extended TABLE (ID BIGINT NOT NULL PRIMARY KEY, LeaseExpiresUtc DATETIME2(3) NOT NULL);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;
        UPDATE q
        SET q.VisibleAtUtc = @LeaseUntil
        OUTPUT inserted.ID, inserted.VisibleAtUtc INTO @Extended (ID, LeaseExpiresUtc)
        FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    DECLARE @ReturnedAt DATETIME2(3) = SYSUTCDATETIME();
    SELECT
        e.ID,
        e.LeaseExpiresUtc,
        CAST(FLOOR(DATEDIFF_BIG(MILLISECOND, @ReturnedAt, e.LeaseExpiresUtc) / 1000.0) AS INT) AS LeaseSecondsRemaining
    FROM @Extended AS e
    ORDER BY e.ID;
END;
