/*
Revision 0012: the minimum interval between two logins per sending account
(issue 16, point 4; TinyMail 8C.5), added in place to mailq.SendingAccount:
    MinLoginIntervalMs  INT NULL, 1-86,400,000 (CK_SendingAccount_LoginInterval);
                        NULL = no interval, which every existing account keeps.
    LastLoginAtUtc      DATETIME2(3) NULL, stamped by mailq.AcquireLoginSlot.
Both columns are nullable without a default, so no existing row needs a
value; only mailq.SendingAccount (one small row per account) changes, and no
mail row is touched at all.  Every step is guarded, so a second run changes
nothing.  Downgrade: alembic/versions/0012_*.py (DOWNGRADE_0012).
Locks: a schema-modification lock on mailq.SendingAccount for the length of
the migration's transaction; stop the workers during the upgrade, as for
every revision.
Every step is dynamic SQL: the model of tools/tsqlcheck (DacFx) takes the
table's shape from sql/tables/mailq.SendingAccount.sql, which already holds
both columns, and would see a static ADD as a second definition of them.
*/
IF COL_LENGTH(N'mailq.SendingAccount', N'MinLoginIntervalMs') IS NULL
    EXEC sys.sp_executesql N'ALTER TABLE mailq.SendingAccount ADD MinLoginIntervalMs INT NULL;';

IF COL_LENGTH(N'mailq.SendingAccount', N'LastLoginAtUtc') IS NULL
    EXEC sys.sp_executesql N'ALTER TABLE mailq.SendingAccount ADD LastLoginAtUtc DATETIME2(3) NULL;';

IF OBJECT_ID(N'mailq.CK_SendingAccount_LoginInterval', N'C') IS NULL
    -- Dynamic also because the column is added earlier in this same batch.
    EXEC sys.sp_executesql
        N'ALTER TABLE mailq.SendingAccount WITH CHECK ADD CONSTRAINT CK_SendingAccount_LoginInterval
          CHECK (MinLoginIntervalMs IS NULL OR MinLoginIntervalMs BETWEEN 1 AND 86400000);';
