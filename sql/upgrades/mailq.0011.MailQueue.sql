/*
Revision 0011: changes mailq.MailQueue in place for the event stream and
mailq.StopMail (issue 16, point 1), without moving, copying or deleting a
queued mail.  Every step is guarded, so a second run changes nothing.
Downgrade: DOWNGRADE_0011 in alembic/versions/0011_*.py (refused with 50261
while a mail is Stopped).
Locks: both steps take a schema-modification lock on mailq.MailQueue for the
length of the migration's transaction; re-checking the constraint reads every
row once and the index rebuild reads the finished mails (no row is written).
Stop the workers during the upgrade, as for every revision.

1. The status 'Stopped': CK_MailQueue_Status is dropped and added again with
   the new value.  ALTER TABLE ... ADD CONSTRAINT checks the existing rows
   (WITH CHECK is the default for a new constraint: ALTER TABLE
   (Transact-SQL), Arguments, WITH CHECK | WITH NOCHECK), which all satisfy
   the wider rule, so the constraint stays trusted.
2. IX_MailQueue_Final (mailq.PurgeMail's range seek) gets 'Stopped' in its
   filter, so Stopped mails are purged like every other finished mail.
mailq.MailEvent and its indexes are new (sql/tables, sql/indexes): no event
is made up for the history before the upgrade; the stream starts with it.
*/
IF EXISTS (
    SELECT 1
    FROM sys.check_constraints AS c
    WHERE
        c.parent_object_id = OBJECT_ID(N'mailq.MailQueue')
        AND c.name = N'CK_MailQueue_Status'
        AND c.[definition] NOT LIKE N'%Stopped%'
)
BEGIN
    ALTER TABLE mailq.MailQueue DROP CONSTRAINT CK_MailQueue_Status;
    -- Dynamic, as the index below: the schema model (tools/tsqlcheck) holds
    -- the constraint of sql/tables/ already, under the same name.
    EXEC sys.sp_executesql
        N'ALTER TABLE mailq.MailQueue ADD CONSTRAINT CK_MailQueue_Status CHECK (
              Status IN (N''UnSent'', N''Sending'', N''Sent'', N''Failed'', N''Cancelled'', N''Expired'', N''Stopped'')
          );';
END;

IF EXISTS (
    SELECT 1
    FROM sys.indexes AS i
    WHERE
        i.object_id = OBJECT_ID(N'mailq.MailQueue')
        AND i.name = N'IX_MailQueue_Final'
        AND i.filter_definition NOT LIKE N'%Stopped%'
)
BEGIN
    DROP INDEX IX_MailQueue_Final ON mailq.MailQueue;
    -- Dynamic, as in revision 0007: created after the DROP in this same batch
    -- (and the schema model holds sql/indexes/'s copy under the same name).
    EXEC sys.sp_executesql
        N'CREATE NONCLUSTERED INDEX IX_MailQueue_Final
          ON mailq.MailQueue (DateProcessed ASC, ID ASC)
          INCLUDE (Status, AccountName)
          WHERE Status IN (N''Sent'', N''Failed'', N''Cancelled'', N''Expired'', N''Stopped'');';
END;
