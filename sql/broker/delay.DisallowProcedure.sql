/*
delay.DisallowProcedure: takes a procedure off the allow-list, revokes MailqRunner's
EXECUTE on it, and refuses its Pending and Held tasks (final, receipt 2, 50306);
a claimed one is refused when its reader checks it.
Parameters:  @ProcedureName NVARCHAR(4000): schema.procedure as listed
Result set:  one row: Refused INT (tasks refused now)
Errors:      50314 @ProcedureName is not on the allow-list
Transaction: its own or the caller's; any error dooms either and is re-raised.  Isolation: READ COMMITTED.
Lock order:  delay.AllowedProcedure, delay.Task, delay.Log, delay.ReceiptDue.
Security:    for db_owner only, like delay.AllowProcedure.
Example:     EXEC delay.DisallowProcedure @ProcedureName = N'dbo.TCXG';
*/
CREATE OR ALTER PROCEDURE delay.DisallowProcedure
    @ProcedureName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE
        @Msg NVARCHAR(2048), @SchemaName SYSNAME = PARSENAME(@ProcedureName, 2),
        @Name SYSNAME = PARSENAME(@ProcedureName, 1), @Revoke NVARCHAR(400), @Refused INT = 0;
    DECLARE @Gone TABLE (TaskID BIGINT NOT NULL PRIMARY KEY, TargetName NVARCHAR(400) NULL);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        DELETE ap
        FROM delay.AllowedProcedure AS ap
        WHERE
            DATALENGTH(@ProcedureName) BETWEEN 2 AND 256 AND PARSENAME(@ProcedureName, 3) IS NULL
            AND ap.SchemaName = @SchemaName AND ap.ProcedureName = @Name;
        IF @@ROWCOUNT = 0
        BEGIN
            SET @Msg = CONCAT(N'@ProcedureName is not on the allow-list; got ', LEFT(@ProcedureName, 300), N'.');
            THROW 50314, @Msg, 1;
        END;
        -- Guarded: the procedure may be gone already (its permissions went with it).
        IF OBJECT_ID(CONCAT(QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name)), N'P') IS NOT NULL
        BEGIN
            SET @Revoke = CONCAT(N'REVOKE EXECUTE ON OBJECT::', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
                N' FROM MailqRunner;');
            EXEC sys.sp_executesql @Revoke;
        END;
        UPDATE t
        SET
            t.TaskState = N'Refused', t.FinishedAtUtc = SYSUTCDATETIME(), t.LastErrorNumber = 50306,
            t.LastErrorMessage = N'the target was disallowed (delay.DisallowProcedure): refused'
        OUTPUT inserted.TaskID, inserted.TargetName INTO @Gone (TaskID, TargetName)
        FROM delay.Task AS t
        WHERE t.TaskState IN (N'Pending', N'Held') AND t.SchemaName = @SchemaName AND t.ProcedureName = @Name;
        SET @Refused = @@ROWCOUNT;
        INSERT INTO delay.Log (TaskID, EventName, TargetName, ErrorNumber, ErrorMessage)
        SELECT g.TaskID, N'Refused', g.TargetName, 50306, N'the target was disallowed' FROM @Gone AS g;
        INSERT INTO delay.ReceiptDue (TaskID) SELECT g.TaskID FROM @Gone AS g;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT @Refused AS Refused;
END;
