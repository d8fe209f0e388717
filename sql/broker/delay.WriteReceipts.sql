/*
delay.WriteReceipts: writes the platform receipts (F108219) of tasks made final, up
to 1,000 in one transaction (one log flush), and takes them off delay.ReceiptDue.
As MailqRunner: the UPDATE fires the platform's own triggers with the runner's
rights, never dbo's.  If the platform refuses the batch (its constraint or trigger),
each receipt is tried alone; one it refuses is logged (Receipt, 50548) and dropped:
delay.Task keeps the state.  Errors: none raised.
Transaction: its own (returns at once inside a caller's).
Lock order:  delay.ReceiptDue (READPAST: readers never wait for each other),
             delay.Task (read), dbo.tabDIYTable12402, delay.Log.
Example:     EXEC delay.WriteReceipts;   -- delay.RunDueTasks after each batch
*/
CREATE OR ALTER PROCEDURE delay.WriteReceipts
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF @@TRANCOUNT > 0 RETURN;
    DECLARE @TaskID BIGINT = 0, @Alone BIT = 0, @Runner BIT = 0, @Left INT = 1000, @Message NVARCHAR(2048);
    DECLARE @Due TABLE (TaskID BIGINT NOT NULL PRIMARY KEY);
    WHILE @Left > 0
    BEGIN
        IF @Alone = 1
        BEGIN
            -- After a refused batch: one receipt at a time, each in its own transaction.
            SELECT @TaskID = MIN(r.TaskID) FROM delay.ReceiptDue AS r WITH (READPAST) WHERE r.TaskID > @TaskID;
            SET @Left -= 1;
            IF @TaskID IS NULL RETURN;
        END;
        BEGIN TRY
            BEGIN TRANSACTION;
            DELETE FROM @Due;
            DELETE TOP (1000) r
            OUTPUT deleted.TaskID INTO @Due (TaskID)
            FROM delay.ReceiptDue AS r WITH (READPAST, ROWLOCK)
            WHERE @Alone = 0 OR r.TaskID = @TaskID;
            EXECUTE AS USER = N'MailqRunner';
            SET @Runner = 1;
            UPDATE p SET p.F108219 = t.Receipt
            FROM dbo.tabDIYTable12402 AS p
            INNER JOIN @Due AS d ON p.ID = d.TaskID INNER JOIN delay.Task AS t ON d.TaskID = t.TaskID;
            REVERT;
            SET @Runner = 0;
            COMMIT TRANSACTION;
            IF @Alone = 0 RETURN;
        END TRY
        BEGIN CATCH
            SELECT @Message = LEFT(ERROR_MESSAGE(), 2048);
            IF @Runner = 1 REVERT;
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            IF @Alone = 1 AND @Runner = 1
            BEGIN
                DELETE FROM delay.ReceiptDue WHERE TaskID = @TaskID;
                INSERT INTO delay.Log (TaskID, EventName, ErrorNumber, ErrorMessage)
                VALUES (@TaskID, N'Receipt', 50548, CONCAT(N'the platform refused the receipt: ', @Message));
            END;
            IF @Runner = 0 RETURN;   -- not the platform's UPDATE (EXECUTE AS failed: RunnerMissing): left due
            SELECT @Alone = 1, @Runner = 0;
        END CATCH;
    END;
END;
