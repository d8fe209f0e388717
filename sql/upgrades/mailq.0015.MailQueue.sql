/*
Revision 0015: run modes (issue 16, point 3; TinyMail "dryrun, by app and
runmode"), changed in place on mailq.MailQueue without moving, copying or
deleting a queued mail.  Every step is guarded, so a second run changes
nothing.  Downgrade: DOWNGRADE_0015 in alembic/versions/0015_*.py (refused
with 50243 while unfinished mail carries a run mode other than 'prod').

1. RunMode NVARCHAR(32) NOT NULL, default N'prod' (DF_MailQueue_RunMode):
   every existing mail becomes 'prod', the run mode every worker served
   before.  Adding a NOT NULL column with a runtime-constant default is a
   metadata-only change on Enterprise / Developer editions and Azure SQL
   (ALTER TABLE (Transact-SQL), "Adding NOT NULL columns as an online
   operation": the default is kept in metadata and no row is rewritten); on
   Standard it writes every row once.
2. CK_MailQueue_RunMode: a short validated name (1-32 characters, a-z first,
   then a-z 0-9 '-' '_'; binary comparison), the rule EnqueueMail (50240)
   checks.  Added WITH CHECK: it reads every row once, all 'prod'.
3. IX_MailQueue_ClaimByAccount gets RunMode as its second key column
   (AccountName, RunMode, Priority DESC, VisibleAtUtc, ID), so a claim seeks
   only the (account, run mode) pairs its worker serves.  CREATE INDEX ...
   WITH (DROP_EXISTING = ON) replaces it in one statement; DROP_EXISTING may
   change the key columns and sort order (CREATE INDEX (Transact-SQL),
   DROP_EXISTING), and queries keep using the old index until the new one
   replaces it.  ONLINE = ON where the edition supports online index
   operations (engine editions 3, 5, 8, as in the index's own file); CREATE
   INDEX WITH DROP_EXISTING is an operation Microsoft lists as possible online
   ("Guidelines for online index operations"; a nonclustered index whose key
   and INCLUDE columns hold no LOB may be built online on a table that has
   LOB columns).  Standard builds it offline.
Locks: honestly, ONLINE helps little inside the migration: step 1's schema
modification lock on mailq.MailQueue is held until the migration's
transaction commits, so enqueues and claims wait for the whole upgrade
anyway.  The build reads the claimable rows of the table (the filter:
UnSent, Sending) and sorts them; stop the workers during the upgrade, as for
every revision.  Each step is dynamic SQL: the schema model (tools/tsqlcheck)
takes the table and the index from sql/tables/ and sql/indexes/, which hold
the new shape already, and the column is added earlier in this same batch.
*/
IF COL_LENGTH(N'mailq.MailQueue', N'RunMode') IS NULL
    EXEC sys.sp_executesql
        N'ALTER TABLE mailq.MailQueue
          ADD RunMode NVARCHAR(32) NOT NULL CONSTRAINT DF_MailQueue_RunMode DEFAULT (N''prod'');';

IF OBJECT_ID(N'mailq.CK_MailQueue_RunMode', N'C') IS NULL
    EXEC sys.sp_executesql
        N'ALTER TABLE mailq.MailQueue WITH CHECK ADD CONSTRAINT CK_MailQueue_RunMode CHECK (
              LEN(RunMode) BETWEEN 1 AND 32
              AND RunMode COLLATE Latin1_General_100_BIN2 LIKE N''[a-z]%''
              AND RunMode COLLATE Latin1_General_100_BIN2 NOT LIKE N''%[^a-z0-9_-]%''
          );';

IF EXISTS (
    SELECT 1
    FROM sys.indexes AS i
    WHERE
        i.object_id = OBJECT_ID(N'mailq.MailQueue')
        AND i.name = N'IX_MailQueue_ClaimByAccount'
        AND NOT EXISTS (
            SELECT 1
            FROM sys.index_columns AS ic
            INNER JOIN sys.columns AS c ON ic.object_id = c.object_id AND ic.column_id = c.column_id
            WHERE
                ic.object_id = i.object_id AND ic.index_id = i.index_id
                AND ic.key_ordinal = 2 AND c.name = N'RunMode'
        )
)
BEGIN
    IF CAST(SERVERPROPERTY('EngineEdition') AS INT) IN (3, 5, 8)
        EXEC sys.sp_executesql
            N'CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount
              ON mailq.MailQueue (AccountName ASC, RunMode ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
              INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc)
              WHERE Status IN (N''UnSent'', N''Sending'')
              WITH (DROP_EXISTING = ON, ONLINE = ON);';
    ELSE
        EXEC sys.sp_executesql
            N'CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount
              ON mailq.MailQueue (AccountName ASC, RunMode ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
              INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc)
              WHERE Status IN (N''UnSent'', N''Sending'')
              WITH (DROP_EXISTING = ON);';
END;
