/*
delay.FinishTask: moves a task to a final state, sets the platform's receipt,
logs the event and ends the task's conversation (which also drops its timer).
Parameters:  @TaskID       BIGINT, required
             @TaskState    NVARCHAR(16): Done, Failed, Refused or Cancelled
             @EventName    NVARCHAR(16) = NULL: the delay.Log event to write
                           (NULL writes none, e.g. for Done)
             @ErrorNumber  INT = NULL, @ErrorMessage NVARCHAR(4000) = NULL:
                           stored as the task's last error and in the log row
             @SetReceipt   BIT = 1: 0 leaves dbo.tabDIYTable12402 alone; the
                           caller writes the receipt after its COMMIT.  Every
                           transaction that RECEIVEd passes 0: the platform's
                           table may carry constraints or triggers we do not
                           own, and a failure there must never roll back a
                           RECEIVE (delay.Reconcile repairs a receipt that
                           could not be written).
Receipt:     Done 1, Refused 2, Failed 3, Cancelled 4 (dbo.tabDIYTable12402.F108219)
Errors:      50399 called outside a transaction or with an unknown state (a bug)
Transaction: joins the caller's, which must exist: the state change and the
             END CONVERSATION commit or roll back together
Internal:    called by dbo.ProcessDelayQueue and dbo.CancelDelayExecution (both
             run as dbo); no role is granted EXECUTE.
Example:     EXEC delay.FinishTask @TaskID = 42, @TaskState = N'Done';
*/
CREATE OR ALTER PROCEDURE delay.FinishTask
    @TaskID BIGINT,
    @TaskState NVARCHAR(16),
    @EventName NVARCHAR(16) = NULL,
    @ErrorNumber INT = NULL,
    @ErrorMessage NVARCHAR(4000) = NULL,
    @SetReceipt BIT = 1
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    IF @@TRANCOUNT = 0 OR @TaskState IS NULL
        OR @TaskState NOT IN (N'Done', N'Failed', N'Refused', N'Cancelled')
    BEGIN
        SET @Msg = CONCAT(
            N'delay.FinishTask needs its caller''s transaction and a final @TaskState; got @@TRANCOUNT = ',
            @@TRANCOUNT, N', @TaskState = ', ISNULL(@TaskState, N'NULL'), N'.'
        );
        THROW 50399, @Msg, 1;
    END;

    DECLARE
        @Handle UNIQUEIDENTIFIER,
        @TargetName NVARCHAR(400),
        @Attempts INT;

    UPDATE delay.Task
    SET
        TaskState = @TaskState,
        FinishedAtUtc = SYSUTCDATETIME(),
        NextRunAtUtc = NULL,
        LeaseUntilUtc = NULL,
        LastErrorNumber = ISNULL(@ErrorNumber, LastErrorNumber),
        LastErrorMessage = ISNULL(@ErrorMessage, LastErrorMessage),
        @Handle = ConversationHandle,
        @TargetName = TargetName,
        @Attempts = Attempts
    WHERE TaskID = @TaskID;

    -- The receipt is set by the row's ID, never by matching parameter values
    -- (the source design's join on F108211-F108216 missed NULLs and marked
    -- rows with equal parameters together).
    IF ISNULL(@SetReceipt, 1) = 1
        UPDATE dbo.tabDIYTable12402
        SET F108219 = CASE @TaskState
            WHEN N'Done' THEN 1
            WHEN N'Refused' THEN 2
            WHEN N'Failed' THEN 3
            WHEN N'Cancelled' THEN 4
        END
        WHERE ID = @TaskID;

    IF @EventName IS NOT NULL
        INSERT INTO delay.Log (TaskID, EventName, TargetName, Attempt, ErrorNumber, ErrorMessage, ConversationHandle)
        VALUES (@TaskID, @EventName, @TargetName, @Attempts, @ErrorNumber, @ErrorMessage, @Handle);

    -- Every task's conversation ends here, once: no endpoint is left behind.
    -- Ending the initiator side also discards its pending timer.  An endpoint
    -- that no longer exists (ALTER DATABASE ... SET NEW_BROKER removes every
    -- conversation without notice) or is already closed is not ended again:
    -- END CONVERSATION needs an existing conversation
    -- (https://learn.microsoft.com/en-us/sql/t-sql/statements/end-conversation-transact-sql).
    IF @Handle IS NOT NULL AND EXISTS (
        SELECT 1 FROM sys.conversation_endpoints AS e
        WHERE e.conversation_handle = @Handle AND e.state <> 'CD'
    )
        END CONVERSATION @Handle;
END;
