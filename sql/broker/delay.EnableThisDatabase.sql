/*
delay.EnableThisDatabase: declares this database the one that runs its delayed
tasks.  A restored or attached copy with a new Service Broker identity (NEW_BROKER:
its service_broker_guid is not delay.Dispatcher's) runs no task and no hook until a
db_owner runs this there, so a copy never runs production's tasks (delay.Monitor
reports CopyNotEnabled).  Also needed after NEW_BROKER on the live database.
Parameters:  @Confirm BIT = 0: must be 1
Result set:  one row: WasBrokerGuid, BrokerGuid, PendingTasks BIGINT (Pending and Held
             tasks this database will now run)
Errors:      50544 @Confirm is not 1
Transaction: its own or the caller's; any error dooms either and is re-raised.  Isolation: READ COMMITTED.
Lock order:  delay.Dispatcher, then delay.ArmDispatcher's.  Security: db_owner only.
Example:     EXEC delay.EnableThisDatabase @Confirm = 1;
*/
CREATE OR ALTER PROCEDURE delay.EnableThisDatabase
    @Confirm BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Was UNIQUEIDENTIFIER, @Now DATETIME2(3) = SYSUTCDATETIME(), @Current UNIQUEIDENTIFIER;
    SELECT @Current = d.service_broker_guid FROM sys.databases AS d WHERE d.database_id = DB_ID();
    IF ISNULL(@Confirm, 0) <> 1
        THROW 50544, N'@Confirm must be 1: this database then runs its delayed tasks here.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        UPDATE d
        SET @Was = d.BrokerGuid, d.BrokerGuid = @Current, d.EnabledAtUtc = @Now, d.EnabledBy = ORIGINAL_LOGIN()
        FROM delay.Dispatcher AS d
        WHERE d.DispatcherId = 1;
        INSERT INTO delay.Log (EventName, ErrorMessage)
        VALUES (N'Dispatcher', CONCAT(N'enabled for broker identity ', @Current, N' by ', ORIGINAL_LOGIN()));
        EXEC delay.ArmDispatcher @DueAtUtc = @Now;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT @Was AS WasBrokerGuid, @Current AS BrokerGuid,
        (SELECT COUNT_BIG(*) FROM delay.Task AS t WHERE t.TaskState IN (N'Pending', N'Held')) AS PendingTasks;
END;
