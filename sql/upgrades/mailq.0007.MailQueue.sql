/*
Revision 0007: changes the mail-queue tables in place (issue 10), without
moving, copying or deleting a queued mail.  Every step is guarded, so a
second run changes nothing.  Downgrade: alembic/versions/0007_*.py.
Locks: the ALTER COLUMN takes a schema-modification lock on mailq.MailQueue
for the length of the migration's transaction (metadata and the rebuild of
the small filtered key index only): workers and enqueuers wait, they are not
refused.  Stop the workers during the upgrade, as for every revision.

1. Bodies off the hot rows (point 8): the table option 'large value types
   out of row' stores new NVARCHAR(MAX) values (Body, TextBody, Headers) off
   the clustered row, behind a 16-byte pointer.  The option is metadata only;
   values already stored move when next written, which
   mailq.MoveBodiesOutOfRow does in batches after the upgrade (sp_tableoption,
   Remarks).  No column moves to another table, so the claim's result set
   stays as it was.
2. Idempotency keys compare as binary text (point 5): the column gets
   COLLATE Latin1_General_100_BIN2, the comparison of sp_getapplock's
   resource names, which mailq.EnqueueMail now locks on.  Keys unique under
   the old (case-insensitive) collation stay unique under a binary one, so
   the unique index is rebuilt without a conflict.  ALTER COLUMN cannot
   change a column an index or statistics object uses: both are dropped
   first (the index is recreated at once, statistics come back on demand).
3. Who may send as whom (point 10): mailq.ApplicationAccount and
   mailq.ApplicationFrom (created just before this script) are seeded once
   (the extended property mailq.BindingsSeeded on mailq.ApplicationAccount
   records it, so a re-run never binds a later application), so that every existing application keeps working:
   each application is bound to the accounts and From addresses its queued
   or finished mail used; an application without any mail is bound to every
   existing account and to each account's DefaultFromAddress.  Applications
   registered later start unbound: an administrator binds them
   (mailq.BindApplication) before they can enqueue.
*/
IF EXISTS (
    SELECT 1
    FROM sys.tables AS t
    WHERE t.object_id = OBJECT_ID(N'mailq.MailQueue') AND t.large_value_types_out_of_row = 0
)
    EXEC sys.sp_tableoption N'mailq.MailQueue', 'large value types out of row', 1;

IF EXISTS (
    SELECT 1
    FROM sys.columns AS c
    WHERE
        c.object_id = OBJECT_ID(N'mailq.MailQueue')
        AND c.name = N'IdempotencyKey'
        AND c.collation_name <> N'Latin1_General_100_BIN2'
)
BEGIN
    DROP INDEX IF EXISTS UX_MailQueue_IdempotencyKey ON mailq.MailQueue;

    DECLARE @DropStats NVARCHAR(MAX) = N'';
    SELECT @DropStats += N'DROP STATISTICS mailq.MailQueue.' + QUOTENAME(s.name) + N'; '
    FROM sys.stats AS s
    INNER JOIN sys.stats_columns AS sc ON s.object_id = sc.object_id AND s.stats_id = sc.stats_id
    INNER JOIN sys.columns AS c ON sc.object_id = c.object_id AND sc.column_id = c.column_id
    WHERE
        s.object_id = OBJECT_ID(N'mailq.MailQueue')
        AND c.name = N'IdempotencyKey'
        AND NOT EXISTS (
            SELECT 1 FROM sys.indexes AS i WHERE i.object_id = s.object_id AND i.index_id = s.stats_id
        );
    EXEC sys.sp_executesql @DropStats;

    ALTER TABLE mailq.MailQueue ALTER COLUMN IdempotencyKey NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NULL;

    -- Dynamic: the index is created after the ALTER in this same batch.
    EXEC sys.sp_executesql
        N'CREATE UNIQUE NONCLUSTERED INDEX UX_MailQueue_IdempotencyKey
          ON mailq.MailQueue (IdempotencyKey)
          WHERE IdempotencyKey IS NOT NULL;';
END;

IF NOT EXISTS (
    SELECT 1
    FROM sys.extended_properties AS e
    WHERE
        e.class = 1 AND e.major_id = OBJECT_ID(N'mailq.ApplicationAccount') AND e.minor_id = 0
        AND e.name = N'mailq.BindingsSeeded'
)
BEGIN
    INSERT INTO mailq.ApplicationAccount (AppName, AccountName)
    SELECT DISTINCT
        q.AppName,
        q.AccountName
    FROM mailq.MailQueue AS q
    WHERE q.AppName IS NOT NULL;

    INSERT INTO mailq.ApplicationAccount (AppName, AccountName)
    SELECT
        p.AppName,
        a.AccountName
    FROM mailq.Application AS p
    CROSS JOIN mailq.SendingAccount AS a
    WHERE NOT EXISTS (SELECT 1 FROM mailq.MailQueue AS q WHERE q.AppName = p.AppName);

    INSERT INTO mailq.ApplicationFrom (AppName, FromPattern)
    SELECT DISTINCT
        q.AppName,
        LOWER(q.FromAddress) COLLATE Latin1_General_100_BIN2
    FROM mailq.MailQueue AS q
    WHERE q.AppName IS NOT NULL;

    INSERT INTO mailq.ApplicationFrom (AppName, FromPattern)
    SELECT DISTINCT
        p.AppName,
        LOWER(a.DefaultFromAddress) COLLATE Latin1_General_100_BIN2
    FROM mailq.Application AS p
    CROSS JOIN mailq.SendingAccount AS a
    WHERE NOT EXISTS (SELECT 1 FROM mailq.MailQueue AS q WHERE q.AppName = p.AppName);

    EXEC sys.sp_addextendedproperty
        @name = N'mailq.BindingsSeeded', @value = N'0007',
        @level0type = N'SCHEMA', @level0name = N'mailq',
        @level1type = N'TABLE', @level1name = N'ApplicationAccount';
END;
