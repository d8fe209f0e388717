/*
mailq.CompleteDbMailQuery: a runner hands back its query: 'Done' joins the result to the mail (after
CRLF in the body, or attached) and makes it due; 'Failed' or an oversized result stops it (StopMail's row).
Parameters:  @MailItemID INT, @LockToken (the claim's), @Outcome 'Done' | 'Failed'; Done: @Text
             (body) or @Attachment, @FileName, @ContentType; Failed: @Error
Errors:      50661 the claim is lost (finished or taken over); 50662 @Outcome or its arguments.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.MailQueue, mailq.MailAttachment (or StopMail's), then mailq.DbMailItem.
Example:     EXEC mailq.CompleteDbMailQuery @MailItemID = 7, @LockToken = @T, @Outcome = 'Done', @Text = N'...';
*/
CREATE OR ALTER PROCEDURE mailq.CompleteDbMailQuery
    @MailItemID INT,
    @LockToken UNIQUEIDENTIFIER,
    @Outcome VARCHAR(6),
    @Text NVARCHAR(MAX) = NULL,
    @Attachment VARBINARY(MAX) = NULL,
    @FileName NVARCHAR(255) = NULL,
    @ContentType NVARCHAR(255) = NULL,
    @Error NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Hold DATETIME2(3) = '9000-01-01T00:00:00';
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @CrLf NCHAR(2) = NCHAR(13) + NCHAR(10);
    DECLARE @Lost NVARCHAR(200)
        = N'The query runner''s claim on this item is lost (finished, or taken over after its lease).';
    IF @Outcome NOT IN ('Done', 'Failed')
        OR (@Outcome = 'Failed' AND NULLIF(@Error, N'') IS NULL)
        OR (@Outcome = 'Done' AND @Attachment IS NULL AND @Text IS NULL)
        OR (@Outcome = 'Done' AND @Attachment IS NOT NULL AND @Text IS NOT NULL)
        OR (@Attachment IS NOT NULL AND NULLIF(@FileName, N'') IS NULL)
        THROW 50662, N'@Outcome must be Done (with @Text, or @Attachment and @FileName) or Failed (with @Error).', 1;
    DECLARE @MailID BIGINT = (
        SELECT i.MailID
        FROM mailq.DbMailItem AS i
        WHERE i.MailItemID = @MailItemID AND i.QueryState = N'Running' AND i.QueryLockToken = @LockToken
    );
    IF @MailID IS NULL
        THROW 50661, @Lost, 1;
    IF @Outcome = 'Done' AND (
        LEN(@Text) + (SELECT LEN(q.Body) FROM mailq.MailQueue AS q WHERE q.ID = @MailID) + 2 > 2000000
        OR DATALENGTH(@Attachment) > 10485760
    )
        SELECT
            @Outcome = 'Failed',
            @Error = N'the result is over the queue''s limits (2,000,000 characters in the body, 10 MiB attached).';
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        IF @Outcome = 'Done'
        BEGIN
            UPDATE q
            SET
                q.Body = IIF(@Text IS NULL, q.Body, CONCAT(q.Body, @CrLf, @Text)),
                q.DateToProcess = @Now,
                q.VisibleAtUtc = @Now
            FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
            WHERE q.ID = @MailID AND q.Status = N'UnSent' AND q.VisibleAtUtc = @Hold;
            IF @@ROWCOUNT = 1 AND @Attachment IS NOT NULL
                INSERT INTO mailq.MailAttachment (MailID, AttachmentNo, FileName, ContentType, Content)
                VALUES (@MailID, 1, @FileName, COALESCE(@ContentType, N'text/plain'), @Attachment);
        END;
        ELSE IF EXISTS (
            SELECT 1 FROM mailq.MailQueue AS q WHERE q.ID = @MailID AND q.Status IN (N'UnSent', N'Sending')
        )
        BEGIN
            DECLARE @Reason NVARCHAR(4000) = LEFT(CONCAT(N'Query execution failed: ', @Error), 4000);
            EXEC mailq.StopMail @MailID = @MailID, @Reason = @Reason;
        END;
        UPDATE mailq.DbMailItem
        SET
            QueryState = IIF(@Outcome = 'Done', N'Done', N'Failed'),
            QueryLockToken = NULL,
            QueryDueAtUtc = NULL,
            QueryError = IIF(@Outcome = 'Done', NULL, LEFT(@Error, 4000)),
            QueryFinishedAtUtc = @Now
        WHERE MailItemID = @MailItemID AND QueryState = N'Running' AND QueryLockToken = @LockToken;
        IF @@ROWCOUNT = 0
            THROW 50661, @Lost, 1;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
