/*
dbo.CancelDelayExecution: cancels a task that has not started: its receipt
becomes 4, its conversation ends (which drops its timer), and it never runs.
Parameters:  @TaskID BIGINT, required: the ID InitiateDelayExecution returned
             (dbo.tabDIYTable12402.ID)
Result set:  none.
Errors:      50320 @TaskID missing or names no scheduled task
             50321 the task is not Scheduled or Retrying (already running or
                   finished, also when it finished while the cancel waited
                   for its conversation; or ending: its conversation is in
                   state DI/ER and the reader fails it; the message names
                   the state)
             50342 the task was initiated by another login, and the caller is
                   neither in MailqAdmin nor db_owner
             50343 the task's conversation no longer exists (the database was
                   copied and given a NEW_BROKER, or a conversation was ended
                   by hand): run EXEC delay.Reconcile, then cancel again
Who:         members of MailqAdmin and db_owner cancel any task; everybody
             else (role MailqDelayCaller) only the tasks their own login
             initiated (delay.Task.CreatedBy = ORIGINAL_LOGIN()), as DESIGN.md
             and the DBA guide say.  Tasks inserted by the platform belong to
             the platform's login.
Transaction: opens its own if none is open, else works inside the caller's;
             any error, a refusal included, dooms the caller's transaction
             (XACT_ABORT ON) and is re-raised: the caller must roll back.  No
             savepoint: SAVE TRANSACTION fails inside a distributed (MSDTC)
             transaction (error 627), and a doomed transaction cannot return
             to one.  Validation runs before any work, so a refusal changes
             nothing that a rollback would have to undo.
Lock order:  the task's cancel lock (an application lock, transaction-owned),
             then the task's conversation group (BEGIN CONVERSATION TIMER
             locks it), then its delay.Task row (UPDLOCK), then
             dbo.tabDIYTable12402: the order of dbo.ProcessDelayQueue (a
             delay-0 request takes the cancel lock and the task's group
             before the row too; a timer message holds the group already).
Security:    runs as the caller, to learn the caller's roles; the work is done
             by delay.CancelTask (EXECUTE AS OWNER, reached through ownership
             chaining, granted to nobody): END CONVERSATION needs the
             conversation's owner (dbo, who began it in the trigger).
Example:     EXEC dbo.CancelDelayExecution @TaskID = 42;
*/
CREATE OR ALTER PROCEDURE dbo.CancelDelayExecution
    @TaskID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    -- Evaluated here, in the caller's security context (delay.CancelTask
    -- runs as dbo, who is a member of everything).
    DECLARE @MayCancelAny BIT = IIF(
        IS_MEMBER(N'MailqAdmin') = 1 OR IS_MEMBER(N'db_owner') = 1, 1, 0
    );
    DECLARE @CallerLogin NVARCHAR(128) = ORIGINAL_LOGIN();

    EXEC delay.CancelTask
        @TaskID = @TaskID,
        @CallerLogin = @CallerLogin,
        @MayCancelAny = @MayCancelAny;
END;
