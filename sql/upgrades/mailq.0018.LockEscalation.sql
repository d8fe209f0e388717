/*
Revision 0018: lock escalation disabled on the three tables a batch writes
row by row in one statement (mailq.EnqueueMailBatch, issue 16 point 6):
mailq.MailQueue, mailq.MailAttachment and mailq.MailEvent.

Why: one statement that takes 5,000 locks on one table or index makes SQL
Server try to escalate them to a table lock (Microsoft, "Lock escalation"
in the transaction locking and row versioning guide), held until the
transaction ends.  A 10,000-mail batch would then hold a table lock on
mailq.MailQueue (every claim and enqueue waits: READPAST skips locked rows,
not a locked table) and on mailq.MailEvent (every acknowledgement writes an
event there, so every state change in the queue would wait).  With
LOCK_ESCALATION = DISABLE the batch keeps its row locks, which nobody else
asks for (new rows), and the queue goes on.
Price: lock memory.  A 10,000-mail batch holds about one lock per new row
and index (some 100,000 locks, a few tens of MB at most), released at
commit; no procedure of this package takes more (claims, finalization and
purges are bounded below 5,000 locks per statement by design).  An ad-hoc
statement a DBA runs over millions of rows of these tables also keeps its
row locks: run such statements in batches (as mailq.PurgeMail does).
Microsoft ("ALTER TABLE", LOCK_ESCALATION): DISABLE "prevents lock
escalation in most cases"; table locks are still taken where the engine
needs them (for example a SERIALIZABLE scan of a heap; these tables have
clustered indexes).
Every step is guarded (sys.tables.lock_escalation_desc), so a second run
changes nothing.  The option is metadata: the ALTER takes a short
schema-modification lock and touches no row.  Downgrade:
alembic/versions/0018_*.py (DOWNGRADE_0018) sets TABLE, the default, back.
The ALTERs are dynamic SQL only because the project's sqlfluff dialect does
not parse ALTER TABLE ... SET (LOCK_ESCALATION = ...); the statement is
Microsoft's documented syntax.
*/
IF EXISTS (
    SELECT 1 FROM sys.tables
    WHERE object_id = OBJECT_ID(N'mailq.MailQueue') AND lock_escalation_desc <> N'DISABLE'
)
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailQueue SET (LOCK_ESCALATION = DISABLE);';

IF EXISTS (
    SELECT 1 FROM sys.tables
    WHERE object_id = OBJECT_ID(N'mailq.MailAttachment') AND lock_escalation_desc <> N'DISABLE'
)
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailAttachment SET (LOCK_ESCALATION = DISABLE);';

IF EXISTS (
    SELECT 1 FROM sys.tables
    WHERE object_id = OBJECT_ID(N'mailq.MailEvent') AND lock_escalation_desc <> N'DISABLE'
)
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailEvent SET (LOCK_ESCALATION = DISABLE);';
