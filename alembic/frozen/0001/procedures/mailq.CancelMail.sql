/*
mailq.CancelMail: cancels a mail that is waiting to be sent (UnSent).  A mail
being sent (Sending) cannot be cancelled safely: the SMTP server may already
have it; cancel again after it was acknowledged, or let it finish.
Parameters:  @ID BIGINT, required.
Result set:  one row: ID, Status ('Cancelled'), NextAttemptUtc (NULL).
Errors:      50136 @ID missing; 50201 unknown mail; 50204 the mail is not UnSent.
Transaction: joins the caller's via a savepoint, else opens its own.
Example:     EXEC mailq.CancelMail @ID = 101;
*/
CREATE OR ALTER PROCEDURE mailq.CancelMail
    @ID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50136, N'@ID is required.', 1;

    DECLARE @Status NVARCHAR(16);
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0 BEGIN TRANSACTION;
        ELSE SAVE TRANSACTION CancelMail;

        -- UPDLOCK: read and change the row under one lock, so a claim cannot
        -- slip in between the check and the update.
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
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;

        IF @TranCount = 0 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION CancelMail;
        THROW;
    END CATCH;

    SELECT
        @ID AS ID,
        N'Cancelled' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc;
END;
