/*
Allow-lists (and pins) the hook dispatcher's delayed-execution target,
mailq.HookDispatcherTask (docs/hooks.md).  Runs after the procedure is
created, as the deploying db_owner; re-listing refreshes the pin, so a
revision that changes broker/mailq.HookDispatcherTask.sql must carry this
file too (it follows that file in sql/BuildOrder.txt).  The downgrade removes
the entry (delay.DisallowProcedure) before the procedure is dropped.
*/
EXEC delay.AllowProcedure @ProcedureName = N'mailq.HookDispatcherTask', @AllowBareName = 0;
