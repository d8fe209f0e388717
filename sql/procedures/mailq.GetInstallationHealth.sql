/*
mailq.GetInstallationHealth: one row per installation check, for `mailq-db doctor`; reads only.
Parameters:  none.
Result set:  Area, CheckName, Status ('OK', 'WARN' or 'FAIL'), Detail, Fix (runnable as is);
             catalog views show only what the caller may see (WARN, the Fix names the right).
Errors:      none of its own.
Transaction: reads only.  Isolation: sets READ COMMITTED.  Lock order: none (no locking reads).
Example:     EXEC mailq.GetInstallationHealth;
*/
CREATE OR ALTER PROCEDURE mailq.GetInstallationHealth
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Check TABLE (
        Position INT IDENTITY (1, 1) NOT NULL PRIMARY KEY,
        Area NVARCHAR(30) NOT NULL,
        CheckName NVARCHAR(200) NOT NULL,
        Status NVARCHAR(4) NOT NULL,
        Detail NVARCHAR(4000) NULL,
        Fix NVARCHAR(4000) NULL
    );
    DECLARE @Compat INT, @Rcsi BIT, @Broker BIT;
    SELECT
        @Compat = d.compatibility_level,
        @Rcsi = d.is_read_committed_snapshot_on,
        @Broker = d.is_broker_enabled
    FROM sys.databases AS d
    WHERE d.database_id = DB_ID();
    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    VALUES
    (
        N'Server', N'Version',  -- as mailq.CheckServer: 2019 (major 15) or later, or Azure (editions 5, 8)
        IIF(
            CAST(SERVERPROPERTY(N'EngineEdition') AS INT) IN (5, 8)
            OR CAST(SERVERPROPERTY(N'ProductMajorVersion') AS INT) >= 15,
            N'OK', N'FAIL'
        ),
        LEFT(REPLACE(REPLACE(@@VERSION, NCHAR(13), N' '), NCHAR(10), N' '), 300),
        IIF(
            CAST(SERVERPROPERTY(N'EngineEdition') AS INT) IN (5, 8)
            OR CAST(SERVERPROPERTY(N'ProductMajorVersion') AS INT) >= 15,
            NULL, N'mailq-db needs SQL Server 2019 or later (see mailq.CheckServer)'
        )
    ),
    (
        N'Server', N'Edition', N'OK',
        CONCAT(CAST(SERVERPROPERTY(N'Edition') AS NVARCHAR(128)), N' (engine edition ',
            CAST(SERVERPROPERTY(N'EngineEdition') AS NVARCHAR(10)), N')'), NULL
    ),
    (
        N'Database', N'CompatibilityLevel', IIF(@Compat >= 130, N'OK', N'FAIL'),
        CONCAT(N'compatibility level ', @Compat),
        IIF(@Compat >= 130, NULL, CONCAT(N'ALTER DATABASE ', QUOTENAME(DB_NAME()), N' SET COMPATIBILITY_LEVEL = 150;'))
    ),
    (
        N'Database', N'ReadCommittedSnapshot', IIF(@Rcsi = 1, N'OK', N'WARN'),
        IIF(
            @Rcsi = 1, N'READ_COMMITTED_SNAPSHOT is on',
            N'READ_COMMITTED_SNAPSHOT is off: report readers and writers can block each other'
        ),
        IIF(
            @Rcsi = 1, NULL,
            CONCAT(
                N'In a maintenance window: ALTER DATABASE ', QUOTENAME(DB_NAME()),
                N' SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE;'
            )
        )
    ),
    (
        N'Broker', N'ServiceBrokerEnabled', IIF(@Broker = 1, N'OK', N'WARN'),
        IIF(
            @Broker = 1, N'Service Broker is enabled',
            N'Service Broker is disabled: delayed execution cannot run (the mail queue can)'
        ),
        IIF(
            @Broker = 1, NULL,
            CONCAT(
                N'Needs exclusive access: ALTER DATABASE ', QUOTENAME(DB_NAME()),
                N' SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE; (rolls back and disconnects other sessions)'
            )
        )
    );
    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT TOP (1)
        N'Schema', N'Revision', N'OK', v.version_num, NULL
    FROM dbo.mailq_alembic_version AS v;
    IF @@ROWCOUNT = 0
        INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
        VALUES (N'Schema', N'Revision', N'FAIL', N'no revision recorded',
            N'mailq-db deploy (with MAILQ_DB_URL in the environment)');
    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Broker',
        N'DelayServiceQueue',
        IIF(q.is_receive_enabled = 1 AND q.is_activation_enabled = 1, N'OK', N'FAIL'),
        CONCAT(N'receive enabled: ', q.is_receive_enabled, N', activation enabled: ', q.is_activation_enabled,
            N', max readers: ', q.max_readers),
        IIF(
            q.is_receive_enabled = 1 AND q.is_activation_enabled = 1, NULL,
            N'ALTER QUEUE dbo.DelayServiceQueue WITH STATUS = ON, ACTIVATION (STATUS = ON); '
            + N'then read the delayed-execution failure log (docs/delayed-execution.md)'
        )
    FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue');
    IF @@ROWCOUNT = 0
        INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
        VALUES (
            N'Broker', N'DelayServiceQueue', N'WARN',
            CONCAT(
                N'dbo.DelayServiceQueue is not visible to user ', QUOTENAME(USER_NAME()),
                N': deployed with -x broker=off, or this user may not see its metadata'
            ),
            CONCAT(
                N'Run mailq-db doctor as a MailqAdmin member, or: ',
                N'GRANT VIEW DEFINITION ON OBJECT::dbo.DelayServiceQueue TO ',
                QUOTENAME(USER_NAME()), N';'
            )
        );
    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Security',
        N'RoleMembership',
        N'OK',
        CONCAT(
            N'user ', QUOTENAME(USER_NAME()), N'; member of: ',
            COALESCE((  -- every role of sql/security, in a fixed order
                SELECT STRING_AGG(r.RoleName, N', ') WITHIN GROUP (ORDER BY r.Position)
                FROM (VALUES (1, N'MailqEnqueuer'), (2, N'MailqSender'), (3, N'MailqAdmin'), (4, N'MailqDelayCaller'),
                    (5, N'MailqMonitor'), (6, N'MailqBounceReader'), (7, N'MailqDbMailUser'),
                    (8, N'MailqDbMailRunner'), (9, N'db_owner')) AS r(Position, RoleName)
                WHERE IS_ROLEMEMBER(r.RoleName) = 1
            ), N'none')
        ),
        NULL;
    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Security',
        CONCAT(N'Execute ', p.ProcName),
        IIF(HAS_PERMS_BY_NAME(p.ProcName, N'OBJECT', N'EXECUTE') = 1, N'OK', N'WARN'),
        CONCAT(
            p.ProcName,
            IIF(HAS_PERMS_BY_NAME(p.ProcName, N'OBJECT', N'EXECUTE') = 1, N' may be executed', N' may not be executed')
        ),
        IIF(
            HAS_PERMS_BY_NAME(p.ProcName, N'OBJECT', N'EXECUTE') = 1, NULL,
            CONCAT(N'ALTER ROLE ', p.RoleName, N' ADD MEMBER ', QUOTENAME(USER_NAME()), N'; (if this login needs it)')
        )
    FROM (
        VALUES
        (N'mailq.EnqueueMail', N'MailqEnqueuer'),
        (N'mailq.ClaimMail', N'MailqSender'),
        (N'mailq.MarkSent', N'MailqSender'),
        (N'mailq.GetQueueStats', N'MailqAdmin')
    ) AS p(ProcName, RoleName);
    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Security',
        N'UnmappedEnqueuers',
        IIF(COUNT_BIG(*) = 0, N'OK', N'WARN'),
        CONCAT(
            COUNT_BIG(*), N' visible member(s) of MailqEnqueuer not mapped to an application',
            IIF(COUNT_BIG(*) = 0, N'', CONCAT(N', e.g. ', QUOTENAME(MIN(m.name))))
        ),
        IIF(
            COUNT_BIG(*) = 0, NULL,
            CONCAT(
                N'EXEC mailq.BindApplication @AppName = N''...'', @PrincipalName = N''',
                REPLACE(MIN(m.name), N'''', N''''''), N''';'
            )
        )
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON rm.member_principal_id = m.principal_id
    WHERE
        rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqEnqueuer')
        AND m.type <> 'R'
        AND m.name NOT IN (SELECT u.PrincipalName FROM mailq.ApplicationPrincipal AS u);
    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Queue',
        N'ExpiredLeases',
        IIF(COUNT_BIG(*) = 0, N'OK', N'WARN'),
        CONCAT(COUNT_BIG(*), N' mail(s) in Sending whose lease expired and that no worker reclaimed yet'),
        IIF(COUNT_BIG(*) = 0, NULL, N'Start a worker (mailq-db worker); a worker that died leaves these behind')
    FROM mailq.MailQueue AS q
    WHERE q.Status = N'Sending' AND q.VisibleAtUtc < @Now;
    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Queue',
        N'FailedLast24Hours',
        IIF(COUNT_BIG(*) = 0, N'OK', N'WARN'),
        CONCAT(COUNT_BIG(*), N' mail(s) Failed in the last 24 hours'),
        IIF(COUNT_BIG(*) = 0, NULL, N'Read them with mailq-db stats; requeue with mailq.RequeueMail once fixed')
    FROM mailq.MailQueue AS q
    WHERE q.Status = N'Failed' AND q.DateProcessed >= DATEADD(HOUR, -24, @Now);
    INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
    SELECT
        N'Accounts',
        CONCAT(N'Blocked ', a.AccountName),
        N'WARN',
        CONCAT(N'blocked until ', CONVERT(NVARCHAR(30), a.BlockedUntilUtc, 126), N' UTC: ', LEFT(a.BlockReason, 300)),
        CONCAT(
            N'Wait, or clear it: EXEC mailq.UnblockSendingAccount @AccountName = N''',
            REPLACE(a.AccountName, N'''', N''''''), N''';'
        )
    FROM mailq.SendingAccount AS a
    WHERE a.BlockedUntilUtc > @Now;
    IF NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.IsDefault = 1)
        INSERT INTO @Check (Area, CheckName, Status, Detail, Fix)
        VALUES (
            N'Accounts', N'DefaultAccount', N'WARN', N'no default sending account: EnqueueMail needs @AccountName',
            N'EXEC mailq.UpsertSendingAccount @AccountName = N''...'', @DefaultFromAddress = N''...'', @IsDefault = 1;'
        );
    SELECT
        c.Area,
        c.CheckName,
        c.Status,
        c.Detail,
        c.Fix
    FROM @Check AS c
    ORDER BY c.Position;
END;
