/*
mailq.CancelMail: cancels an UnSent mail (a Sending one may already be at the SMTP server).
Parameters:  @ID BIGINT, required.  Result set: one row: ID, Status ('Cancelled'), NextAttemptUtc (NULL).
Errors:      50136 @ID missing; 50201 unknown mail; 50204 the mail is not UnSent.
Transaction: its own if none is open, else the caller's; an error dooms it (XACT_ABORT ON).
Isolation:   sets READ COMMITTED (UPDLOCK check-then-update).  Lock order: mailq.MailQueue, mailq.MailEvent.
Example:     EXEC mailq.CancelMail @ID = 101;
*/
CREATE OR ALTER PROCEDURE mailq.CancelMail
    @ID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50136, N'@ID is required.', 1;
    DECLARE @Status NVARCHAR(16);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        SELECT @Status = q.Status
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @ID;
        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status <> N'UnSent'
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' is ', @Status, N'; only an UnSent mail can be cancelled.');
            THROW 50204, @Msg, 1;
        END;
        UPDATE q
        SET
            q.Status = N'Cancelled',
            q.DateProcessed = SYSUTCDATETIME()
        OUTPUT
            inserted.ID, inserted.AppName, N'Cancelled', inserted.Status, inserted.AttemptCount,
            NULL, NULL, inserted.DateProcessed
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        @ID AS ID,
        N'Cancelled' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc;
END;
