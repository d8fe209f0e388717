/*
mailq.FindMail: the mails a bulk action of `mailq-db dashboard` would touch
(cancel UnSent mail; requeue Failed, Cancelled, Expired or Stopped mail),
per account in VisibleAtUtc order.  Reads only: the dashboard shows the list, asks to confirm,
then calls mailq.CancelMail or mailq.RequeueMail once per listed ID.
Parameters:  @Status NVARCHAR(16), required: UnSent, Failed, Cancelled,
             Expired or Stopped
             @AccountName NVARCHAR(128), NULL = every account
             @RunMode NVARCHAR(32), NULL = every run mode
             @MaxRows INT 1-1000, default 100
Result set:  up to @MaxRows rows: ID, MessageID, AccountName, RunMode, Status,
             Subject, EnqueuedAtUtc, DateProcessed, AttemptCount, LastError
Plan:        a range seek on IX_MailQueue_Status (Status = @Status, and
             AccountName = @AccountName when given) in key order, one key
             lookup per row examined (run mode, subject, error); TOP (@MaxRows)
             stops it: the cost is bounded by the mail of that status and
             account, never the whole history.
Errors:      50581 @Status missing or not one of the five; 50582 @MaxRows
             out of range.
Transaction: reads only; opens none.  Isolation: sets READ COMMITTED itself.
Lock order:  none (no locking reads).
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

    -- INDEX + FORCESEEK: the narrow status index, seeked on (Status
    -- [, AccountName]); never a scan of the clustered rows.
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
    FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Status), FORCESEEK)
    WHERE
        q.Status = @Status
        AND (@AccountName IS NULL OR q.AccountName = @AccountName)
        AND (@RunMode IS NULL OR q.RunMode = @RunMode)
    ORDER BY q.AccountName, q.VisibleAtUtc, q.ID
    OPTION (RECOMPILE);
END;
