/*
mailq.FindMail: the mails a bulk action of `mailq-db dashboard` would touch, per account in
VisibleAtUtc order; reads only (one bounded seek on IX_MailQueue_Status).
Parameters:  @Status: UnSent, Failed, Cancelled, Expired or Stopped; @AccountName, @RunMode:
             NULL = all; @MaxRows INT 1-1000, default 100
Errors:      50581 @Status missing or not one of the five; 50582 @MaxRows out of range.
Transaction: reads only.  Isolation: sets READ COMMITTED.  Lock order: none.
Example:     EXEC mailq.FindMail @Status = N'Failed', @AccountName = N'default', @MaxRows = 500;
*/
CREATE OR ALTER PROCEDURE mailq.FindMail
    @Status NVARCHAR(16),
    @AccountName NVARCHAR(128) = NULL,
    @RunMode NVARCHAR(32) = NULL,
    @MaxRows INT = 100
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @MaxRows = COALESCE(@MaxRows, 100);
    IF @Status IS NULL OR @Status NOT IN (N'UnSent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
    BEGIN
        SET @Msg = CONCAT(
            N'@Status must be UnSent, Failed, Cancelled, Expired or Stopped; got ''', @Status, N'''.'
        );
        THROW 50581, @Msg, 1;
    END;
    IF @MaxRows NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@MaxRows must be 1-1000; got ', @MaxRows, N'.');
        THROW 50582, @Msg, 1;
    END;
    SELECT TOP (@MaxRows)
        q.ID,
        q.MessageID,
        q.AccountName,
        q.RunMode,
        q.Status,
        q.Subject,
        q.dtStamp AS EnqueuedAtUtc,
        q.DateProcessed,
        q.AttemptCount,
        q.LastError
    FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Status), FORCESEEK)  -- a seek, never a scan
    WHERE
        q.Status = @Status
        AND (@AccountName IS NULL OR q.AccountName = @AccountName)
        AND (@RunMode IS NULL OR q.RunMode = @RunMode)
    ORDER BY q.AccountName, q.VisibleAtUtc, q.ID
    OPTION (RECOMPILE);
END;
