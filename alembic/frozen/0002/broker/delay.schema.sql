/*
Schema delay: the internal objects of delayed execution (bookkeeping, allow-list,
log, settings, views, admin procedures).  The public contract stays in dbo, as
the source document names it: dbo.InitiateDelayExecution,
dbo.CancelDelayExecution, dbo.tabDIYTable12402, dbo.DelayServiceQueue,
dbo.ProcessDelayQueue.
Owned by dbo so that ownership chaining lets the dbo procedures and the trigger
read and write these tables for callers that hold only EXECUTE.
CREATE SCHEMA must be alone in its batch, so it cannot sit under an IF;
Alembic runs this batch once, in the revision that introduces it.
*/
CREATE SCHEMA delay AUTHORIZATION dbo;
