-- mailq-db deployment script: run it with sqlcmd (-b -I recommended) or in
-- SSMS with Query > SQLCMD Mode on.  It stops at the first error.  In SSMS
-- the session stays open after a stop: run IF @@TRANCOUNT > 0 ROLLBACK; and
-- close the window (never COMMIT: a syntax error leaves the failed revision's
-- transaction open; closing also releases the deployment lock).
:on error exit
:setvar __IsSqlCmdEnabled "True"
GO
IF N'$(__IsSqlCmdEnabled)' NOT LIKE N'True'
BEGIN
    RAISERROR(N'mailq-db: SQLCMD mode must be enabled to run this script (sqlcmd, or SSMS: Query > SQLCMD Mode).', 16, 1);
    SET NOEXEC ON;
END
GO
IF @@ERROR <> 0 BEGIN RAISERROR(N'mailq-db: the checks before the first revision stopped the deployment (see the error above); the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END
GO


SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;
SET LOCK_TIMEOUT 30000;
GO
IF @@ERROR <> 0 BEGIN RAISERROR(N'mailq-db: the checks before the first revision stopped the deployment (see the error above); the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DECLARE @Msg NVARCHAR(2048);
IF DB_NAME() IN (N'master', N'msdb', N'tempdb', N'model')
BEGIN
    SET @Msg = CONCAT(N'mailq-db deploys into an application database, never into the system database ',
        QUOTENAME(DB_NAME()), N'. Connect to the target database (sqlcmd -d <database>, or the database in the URL).');
    THROW 50412, @Msg, 1;
END;
IF IS_ROLEMEMBER(N'db_owner') = 0 AND IS_SRVROLEMEMBER(N'sysadmin') = 0 AND USER_NAME() <> N'dbo'
BEGIN
    SET @Msg = CONCAT(N'The deployment creates schemas, roles, tables and Service Broker objects: the login ',
        QUOTENAME(SUSER_SNAME()), N' (user ', QUOTENAME(USER_NAME()), N') must be a member of db_owner in ',
        QUOTENAME(DB_NAME()), N' for the deployment, nothing afterwards.');
    THROW 50413, @Msg, 1;
END;
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NULL
BEGIN
    DECLARE @Elsewhere NVARCHAR(300) = (
        SELECT TOP (1) QUOTENAME(SCHEMA_NAME(t.schema_id)) + N'.' + QUOTENAME(t.name)
        FROM sys.tables AS t WHERE t.name = N'mailq_alembic_version' AND t.schema_id <> SCHEMA_ID(N'dbo'));
    IF @Elsewhere IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(N'The mailq-db version table is ', @Elsewhere, N' (an older mailq-db created it in the ',
            N'deploying user''s default schema); it now lives in dbo. Move it with: ALTER SCHEMA dbo TRANSFER ',
            @Elsewhere, N'; then deploy again.');
        THROW 50417, @Msg, 1;
    END;
END;
GO
IF @@ERROR <> 0 BEGIN RAISERROR(N'mailq-db: the checks before the first revision stopped the deployment (see the error above); the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DECLARE @Lock INT;
EXEC @Lock = sys.sp_getapplock @Resource = N'mailq-db deploy', @LockMode = N'Exclusive',
    @LockOwner = N'Session', @LockTimeout = 30000;
IF @Lock < 0
BEGIN
    DECLARE @Msg NVARCHAR(2048) = CONCAT(N'Another mailq-db deployment holds the deployment lock on ',
        QUOTENAME(DB_NAME()), N' (sp_getapplock returned ', @Lock, N'); run again when it has finished.');
    THROW 50416, @Msg, 1;
END;
GO
IF @@ERROR <> 0 BEGIN RAISERROR(N'mailq-db: the checks before the first revision stopped the deployment (see the error above); the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'dbo.mailq_deployment_option', N'U') IS NULL
    CREATE TABLE dbo.mailq_deployment_option (
        Name NVARCHAR(128) NOT NULL CONSTRAINT PK_mailq_deployment_option PRIMARY KEY,
        Value NVARCHAR(400) NOT NULL,
        ChangedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_mailq_deployment_option_ChangedAtUtc DEFAULT SYSUTCDATETIME()
    );
IF OBJECT_ID(N'dbo.mailq_deployment_file', N'U') IS NULL
    CREATE TABLE dbo.mailq_deployment_file (
        Revision VARCHAR(32) NOT NULL,
        FilePath NVARCHAR(400) NOT NULL,
        Sha256 CHAR(64) NOT NULL,
        AppliedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_mailq_deployment_file_AppliedAtUtc DEFAULT SYSUTCDATETIME(),
        CONSTRAINT PK_mailq_deployment_file PRIMARY KEY (Revision, FilePath)
    );
GO
IF @@ERROR <> 0 BEGIN RAISERROR(N'mailq-db: the checks before the first revision stopped the deployment (see the error above); the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
BEGIN TRANSACTION;

-- Running downgrade 0001 -> 

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;
GO
DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 0
BEGIN
    -- Nothing was done in this transaction yet: end it and skip the rest.
    IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
    PRINT CONCAT(N'mailq-db: the database is already at ', ISNULL(@Current, N'base'), N'; nothing to do.');
    SET NOEXEC ON;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 1 AND @Current NOT IN ('0001')
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' is at revision ', @Current,
        N', which this mailq-db does not know (its newest is 0001): a newer mailq-db deployed it. Deploy with that version or a later one.');
    THROW 50421, @Msg, 1;
END;
IF NOT (@Rows = 1 AND @Current = '0001')
BEGIN
    SET @Msg = CONCAT(N'This downgrade removes revision 0001; ', QUOTENAME(DB_NAME()),
        N' is at ', ISNULL(@Current, N'no revision'),
        N'. Render the downgrade for this database with: mailq-db deploy --sql --downgrade ', ISNULL(@Current, N'head'), N':<target>.');
    THROW 50411, @Msg, 1;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'off'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' was deployed with -x broker=off (stored in dbo.mailq_deployment_option); this script includes delayed execution. Render it with -x broker=off, or add delayed execution with -x broker=add (docs/dba-guide.md, section 4).');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'on', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'on';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'on');
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DECLARE @Dropped TABLE (Seq INT IDENTITY (1, 1) PRIMARY KEY, Name NVARCHAR(300) NOT NULL,
    RowFilter NVARCHAR(1000) NULL, NeedsTable NVARCHAR(300) NULL);
INSERT INTO @Dropped (Name, RowFilter, NeedsTable) VALUES
    (N'mailq.SendingAccount', NULL, NULL),
    (N'mailq.RateBudget', NULL, NULL),
    (N'mailq.Application', NULL, NULL),
    (N'mailq.MailQueue', NULL, NULL),
    (N'mailq.MailAttachment', NULL, NULL),
    (N'mailq.MailAttempt', NULL, NULL),
    (N'mailq.ApplicationAccount', NULL, NULL),
    (N'mailq.ApplicationFrom', NULL, NULL),
    (N'mailq.ApplicationPrincipal', NULL, NULL),
    (N'mailq.EnqueuePolicy', N'ChangedBy IS NOT NULL', NULL),
    (N'mailq.MailRecipientOutcome', NULL, NULL),
    (N'mailq.MailEvent', NULL, NULL),
    (N'mailq.ApplicationHook', NULL, NULL),
    (N'mailq.ApplicationHookFailure', NULL, NULL),
    (N'mailq.Suppression', NULL, NULL),
    (N'mailq.SuppressionHistory', NULL, NULL),
    (N'mailq.BounceReport', NULL, NULL),
    (N'mailq.MailTemplate', NULL, NULL),
    (N'mailq.MailTemplateVersion', NULL, NULL),
    (N'mailq.DbMailProfile', NULL, NULL),
    (N'mailq.DbMailAccount', NULL, NULL),
    (N'mailq.DbMailProfileAccount', NULL, NULL),
    (N'mailq.DbMailPrincipalProfile', NULL, NULL),
    (N'mailq.DbMailItem', NULL, NULL),
    (N'delay.AllowedProcedure', NULL, NULL),
    (N'delay.Task', NULL, NULL),
    (N'delay.TaskKey', NULL, NULL),
    (N'delay.ReceiptDue', NULL, NULL),
    (N'delay.Log', NULL, NULL),
    (N'dbo.tabDIYTable12402', N'EXISTS (SELECT 1 FROM delay.Installation AS i WHERE i.Item = N''dbo.tabDIYTable12402'' AND i.Detail = N''created'')', N'delay.Installation'),
    (N'mailq.HookDispatcher', NULL, NULL);
DECLARE @Seq INT = 0, @Name NVARCHAR(300), @RowFilter NVARCHAR(1000), @NeedsTable NVARCHAR(300),
    @Count BIGINT, @Sql NVARCHAR(MAX), @Found NVARCHAR(MAX) = N'', @Msg NVARCHAR(2048);
WHILE 1 = 1
BEGIN
    SELECT TOP (1) @Seq = d.Seq, @Name = d.Name, @RowFilter = d.RowFilter, @NeedsTable = d.NeedsTable
    FROM @Dropped AS d WHERE d.Seq > @Seq ORDER BY d.Seq;
    IF @@ROWCOUNT = 0 BREAK;
    IF OBJECT_ID(@Name, N'U') IS NULL OR (@NeedsTable IS NOT NULL AND OBJECT_ID(@NeedsTable, N'U') IS NULL)
        CONTINUE;
    SET @Sql = CONCAT(N'SELECT @n = COUNT_BIG(*) FROM ', QUOTENAME(PARSENAME(@Name, 2)), N'.',
        QUOTENAME(PARSENAME(@Name, 1)), N' WHERE ' + @RowFilter, N';');
    EXEC sys.sp_executesql @Sql, N'@n BIGINT OUTPUT', @n = @Count OUTPUT;
    IF @Count > 0 SET @Found = CONCAT(@Found, N', ', @Name, N' (', @Count, N' rows)');
END;
IF @Found <> N''
BEGIN
    SET @Msg = CONCAT(N'This downgrade of revision 0001 would drop tables that hold rows: ',
        STUFF(@Found, 1, 2, N''), N'. Nothing was changed. Back them up and run the downgrade with ',
        N'-x drop_data=yes to drop them with their rows, or empty them first.');
    THROW 50420, @Msg, 1;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DECLARE @Activation INT = (
    SELECT CAST(q.is_activation_enabled AS INT) FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ'));
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = @Activation;
IF @Activation = 1
    ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.Installation', N'U') IS NOT NULL
BEGIN
    DECLARE @Sql NVARCHAR(MAX) = N'';
    SELECT @Sql += CONCAT(N'ENABLE TRIGGER ', SUBSTRING(i.Item, 18, 400), N' ON dbo.tabDIYTable12402; ')
    FROM delay.Installation AS i
    WHERE i.Item LIKE N'disabled trigger %' AND i.Detail = N'0001';
    EXEC sys.sp_executesql @Sql;
    DELETE FROM delay.Installation WHERE Item LIKE N'disabled trigger %' AND Detail = N'0001';
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_mailattachments') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_mailattachments FROM MailqDbMailUser;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_mailattachments') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_mailattachments FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_profile') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_profile FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_account') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_account FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_profileaccount') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_profileaccount FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_principalprofile') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_principalprofile FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_configuration') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_configuration FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ClaimDbMailQuery') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimDbMailQuery FROM MailqDbMailRunner;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.CompleteDbMailQuery') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.CompleteDbMailQuery FROM MailqDbMailRunner;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_configuration;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_principalprofile;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_profileaccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_account;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_profile;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_mailattachments;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.CompleteDbMailQuery;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.ClaimDbMailQuery;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF DATABASE_PRINCIPAL_ID(N'MailqDbMailRunner') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqDbMailRunner DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqDbMailRunner');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqDbMailRunner;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.GetTaskMetrics') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::delay.GetTaskMetrics FROM MailqMonitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'dbo.DelayServiceQueue') IS NOT NULL
    REVOKE VIEW DEFINITION ON OBJECT::dbo.DelayServiceQueue FROM MailqMonitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetQueueMetrics') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetQueueMetrics FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetMailHistory') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailHistory FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.FindMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.FindMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetQueueMetrics') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetQueueMetrics FROM MailqMonitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetMailHistory') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailHistory FROM MailqMonitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.FindMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.FindMail FROM MailqMonitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetMailEvents') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailEvents FROM MailqMonitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetQueueStats') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetQueueStats FROM MailqMonitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetSuppressionStats') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetSuppressionStats FROM MailqMonitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.FindMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetMailHistory;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetQueueMetrics;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF DATABASE_PRINCIPAL_ID(N'MailqMonitor') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqMonitor DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqMonitor');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqMonitor;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RecordBounce') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RecordBounce FROM MailqBounceReader;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RecordUnsubscribe') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RecordUnsubscribe FROM MailqBounceReader;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RecordBounce') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RecordBounce FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RecordUnsubscribe') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RecordUnsubscribe FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.AddSuppression') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.AddSuppression FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RemoveSuppression') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RemoveSuppression FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ListSuppressions') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ListSuppressions FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetSuppressionStats') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetSuppressionStats FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.PurgeBounceReports') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.PurgeBounceReports FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.Suppressions') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.Suppressions FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RecentBounceReports') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.RecentBounceReports FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.PurgeBounceReports;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetSuppressionStats;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.ListSuppressions;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.RemoveSuppression;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.AddSuppression;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.RecordUnsubscribe;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.RecordBounce;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.CheckBounceReport;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.ApplySuppressions;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.RecentBounceReports;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.Suppressions;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.SuppressionsAsOf;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF DATABASE_PRINCIPAL_ID(N'MailqBounceReader') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqBounceReader DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqBounceReader');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqBounceReader;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.StartHookDispatcher') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.StartHookDispatcher FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.StartHookDispatcher;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.PendingTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.PendingTasks FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.FinishedTasks') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.FinishedTasks FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.Health') IS NOT NULL
    REVOKE SELECT ON OBJECT::delay.Health FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'dbo.DelayServiceQueue') IS NOT NULL
    REVOKE VIEW DEFINITION ON OBJECT::dbo.DelayServiceQueue FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.GetTaskMetrics') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::delay.GetTaskMetrics FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.Monitor') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::delay.Monitor FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.PurgeHistory') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::delay.PurgeHistory FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'dbo.CancelDelayExecution') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::dbo.CancelDelayExecution FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'dbo.InitiateDelayExecution') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::dbo.InitiateDelayExecution FROM MailqDelayCaller;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'dbo.CancelDelayExecution') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::dbo.CancelDelayExecution FROM MailqDelayCaller;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.GetTaskMetrics;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS delay.Health;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS delay.FinishedTasks;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS delay.PendingTasks;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.PurgeHistory;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.Monitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.EnableThisDatabase;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.DisallowProcedure;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.AllowProcedure;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS dbo.CancelDelayExecution;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS dbo.InitiateDelayExecution;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TRIGGER IF EXISTS dbo.trg_tabDIYTable12402_ScheduleDelay;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') IS NOT NULL
    ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (DROP);
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS dbo.ProcessDelayQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.RunDueTasks;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.RunTask;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.WriteReceipts;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS delay.ArmDispatcher;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS delay.CheckTarget;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS delay.Classify;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF EXISTS (SELECT 1 FROM sys.services WHERE name = N'MailqDelayService')
    DROP SERVICE MailqDelayService;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF EXISTS (SELECT 1 FROM sys.service_queues WHERE object_id = OBJECT_ID(N'dbo.DelayServiceQueue'))
    DROP QUEUE dbo.DelayServiceQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = N'MailqDelayContract')
    DROP CONTRACT MailqDelayContract;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = N'MailqDelayRequest')
    DROP MESSAGE TYPE MailqDelayRequest;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.HookDispatcher;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.Installation', N'U') IS NOT NULL
BEGIN
    IF EXISTS (
        SELECT 1 FROM delay.Installation
        WHERE Item = N'dbo.tabDIYTable12402' AND Detail = N'created'
    )
        DROP TABLE IF EXISTS dbo.tabDIYTable12402;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS delay.Dispatcher;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.Log') IS NOT NULL
    DROP INDEX IF EXISTS IX_Log_TaskID ON delay.Log;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS delay.Log;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS delay.ReceiptDue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS delay.TaskKey;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.Task') IS NOT NULL
    DROP INDEX IF EXISTS IX_Task_FinishedAtUtc ON delay.Task;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.Task') IS NOT NULL
    DROP INDEX IF EXISTS IX_Task_Due ON delay.Task;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS delay.Task;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'delay.AllowedProcedure') IS NOT NULL
    DROP INDEX IF EXISTS UX_AllowedProcedure_BareName ON delay.AllowedProcedure;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS delay.AllowedProcedure;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS delay.Setting;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS delay.Installation;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP SCHEMA IF EXISTS delay;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.SendDbMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.SendDbMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.UpsertDbMailProfile') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertDbMailProfile FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.DeleteDbMailProfile') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.DeleteDbMailProfile FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.UpsertDbMailProfileAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertDbMailProfileAccount FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.DeleteDbMailProfileAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.DeleteDbMailProfileAccount FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.UpsertDbMailPrincipalProfile') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertDbMailPrincipalProfile FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.DeleteDbMailPrincipalProfile') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.DeleteDbMailPrincipalProfile FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_allitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_allitems FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_sentitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_sentitems FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_unsentitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_unsentitems FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_faileditems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_faileditems FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_event_log') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_event_log FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.SendDbMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.SendDbMail FROM MailqDbMailUser;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_allitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_allitems FROM MailqDbMailUser;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_sentitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_sentitems FROM MailqDbMailUser;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_unsentitems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_unsentitems FROM MailqDbMailUser;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_faileditems') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_faileditems FROM MailqDbMailUser;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.sysmail_event_log') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.sysmail_event_log FROM MailqDbMailUser;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.DeleteDbMailPrincipalProfile;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.UpsertDbMailPrincipalProfile;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.DeleteDbMailProfileAccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.UpsertDbMailProfileAccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.DeleteDbMailProfile;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.UpsertDbMailProfile;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.SendDbMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.CheckDbMailRequest;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.DbMailAddressProblem;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_event_log;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_faileditems;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_unsentitems;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_sentitems;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.sysmail_allitems;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.DbMailPrincipalProfile') IS NOT NULL
    DROP INDEX IF EXISTS UX_DbMailPrincipalProfile_Default ON mailq.DbMailPrincipalProfile;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.DbMailItem') IS NOT NULL
    DROP INDEX IF EXISTS IX_DbMailItem_QueryDue ON mailq.DbMailItem;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.DbMailItem') IS NOT NULL
    DROP INDEX IF EXISTS IX_DbMailItem_SendRequestDate ON mailq.DbMailItem;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.DbMailItem;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.DbMailPrincipalProfile;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.DbMailProfileAccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.DbMailAccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.DbMailProfile;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF DATABASE_PRINCIPAL_ID(N'MailqDbMailUser') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqDbMailUser DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqDbMailUser');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqDbMailUser;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.AddMailTemplateVersion') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.AddMailTemplateVersion FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetMailTemplate') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailTemplate FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ListMailTemplates') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ListMailTemplates FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ListMailTemplateVersions') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ListMailTemplateVersions FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RetireMailTemplate') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RetireMailTemplate FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetMailTemplate') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailTemplate FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.RetireMailTemplate;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.ListMailTemplateVersions;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.ListMailTemplates;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetMailTemplate;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.AddMailTemplateVersion;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TRIGGER IF EXISTS mailq.trg_MailTemplateVersion_Immutable;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.MailTemplateVersion;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.MailTemplate;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetEventStreamStall') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetEventStreamStall FROM MailqEnqueuer;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetEventStreamStall') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetEventStreamStall FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.SetEnqueuePolicy') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.SetEnqueuePolicy FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetEnqueuePolicy') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetEnqueuePolicy FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetEnqueuePolicy') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetEnqueuePolicy FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RunApplicationHooks') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RunApplicationHooks FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ListApplicationHooks') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ListApplicationHooks FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RecordRecipientOutcomes') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetRecipientOutcomes') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetRecipientOutcomes FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RecordRecipientOutcomes') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetRecipientOutcomes') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetRecipientOutcomes FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RecipientOutcomes') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.RecipientOutcomes FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.FinalizeMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.FinalizeMail FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.FinalizeMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.FinalizeMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.EnqueueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ClaimMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ExtendLease') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ExtendLease FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ReleaseMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ReleaseMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MarkSent') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkSent FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MarkFailed') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkFailed FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RequeueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.RequeueMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.CancelMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.CancelMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.PurgeMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.PurgeMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.UpsertSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertSendingAccount FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.UnblockSendingAccount') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UnblockSendingAccount FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.UpsertApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UpsertApplication FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.BindApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.BindApplication FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.UnbindApplication') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.UnbindApplication FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetQueueStats') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetQueueStats FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetInstallationHealth') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetInstallationHealth FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.QueueCountsByStatus') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.QueueCountsByStatus FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.OldestDueMail') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.OldestDueMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ThroughputPerHour') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.ThroughputPerHour FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.RecentFailures') IS NOT NULL
    REVOKE SELECT ON OBJECT::mailq.RecentFailures FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetMailEvents') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailEvents FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.StopMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.StopMail FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.AcquireLoginSlot') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.AcquireLoginSlot FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ClaimMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ClaimMail FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ExtendLease') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ExtendLease FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.ReleaseMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.ReleaseMail FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MarkSent') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkSent FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MarkFailed') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.MarkFailed FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetInstallationHealth') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetInstallationHealth FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.AcquireLoginSlot') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.AcquireLoginSlot FROM MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.EnqueueMailBatch') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMailBatch FROM MailqEnqueuer;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF TYPE_ID(N'mailq.MailBatchRow') IS NOT NULL
    REVOKE EXECUTE ON TYPE::mailq.MailBatchRow FROM MailqEnqueuer;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.EnqueueMailBatch') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMailBatch FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF TYPE_ID(N'mailq.MailBatchRow') IS NOT NULL
    REVOKE EXECUTE ON TYPE::mailq.MailBatchRow FROM MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.EnqueueMail') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.EnqueueMail FROM MailqEnqueuer;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.GetMailEvents') IS NOT NULL
    REVOKE EXECUTE ON OBJECT::mailq.GetMailEvents FROM MailqEnqueuer;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetEventStreamStall;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.ListApplicationHooks;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.RunApplicationHooks;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.SetApplicationHook;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.StopMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetMailEvents;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetRecipientOutcomes;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.RecordRecipientOutcomes;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetInstallationHealth;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetQueueStats;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.GetEnqueuePolicy;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.SetEnqueuePolicy;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.UnbindApplication;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.BindApplication;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.UpsertApplication;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.AcquireLoginSlot;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.UnblockSendingAccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.UpsertSendingAccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.PurgeMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.RequeueMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.CancelMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.MarkFailed;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.MarkSent;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.ReleaseMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.ExtendLease;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.FinalizeMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.ClaimMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.CheckClaimRequest;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.EnqueueMailBatch;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.EnqueueMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.EnqueueMailRows;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP PROCEDURE IF EXISTS mailq.LockLeasedMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.RecipientOutcomes;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.RecentFailures;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.ThroughputPerHour;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.OldestDueMail;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP VIEW IF EXISTS mailq.QueueCountsByStatus;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.EnqueueMailCheck;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.MailBatchJson;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.MailAttachmentList;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TYPE IF EXISTS mailq.MailBatchRow;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.FilterSuppressedRecipients;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.MailRecipientList;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.BounceReport') IS NOT NULL
    DROP INDEX IF EXISTS IX_BounceReport_ReceivedAtUtc ON mailq.BounceReport;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.BounceReport') IS NOT NULL
    DROP INDEX IF EXISTS IX_BounceReport_Address ON mailq.BounceReport;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.BounceReport;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.SuppressionHistory;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.Suppression;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.HookPin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.ParseIDList;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP FUNCTION IF EXISTS mailq.ParseAddressList;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_ClaimByApp ON mailq.MailQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.ApplicationHookFailure;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.ApplicationHook;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailEvent') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailEvent_MailID ON mailq.MailEvent;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailEvent') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailEvent_AppName ON mailq.MailEvent;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.MailEvent;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_Status ON mailq.MailQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.SendingAccount') IS NOT NULL
    DROP INDEX IF EXISTS UX_SendingAccount_IsDefault ON mailq.SendingAccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailAttempt') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailAttempt_EndedAtUtc ON mailq.MailAttempt;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_Final ON mailq.MailQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS UX_MailQueue_IdempotencyKey ON mailq.MailQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.MailRecipientOutcome;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_Expiry ON mailq.MailQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_Finalize ON mailq.MailQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF OBJECT_ID(N'mailq.MailQueue') IS NOT NULL
    DROP INDEX IF EXISTS IX_MailQueue_ClaimByAccount ON mailq.MailQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.EnqueuePolicy;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.ApplicationPrincipal;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.ApplicationFrom;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.ApplicationAccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.MailAttempt;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.MailAttachment;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.MailQueue;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.Application;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.RateBudget;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS mailq.SendingAccount;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF DATABASE_PRINCIPAL_ID(N'MailqRunner') IS NOT NULL
    DROP USER MailqRunner;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF DATABASE_PRINCIPAL_ID(N'MailqDelayCaller') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqDelayCaller DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqDelayCaller');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqDelayCaller;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF DATABASE_PRINCIPAL_ID(N'MailqAdmin') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqAdmin DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqAdmin');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqAdmin;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF DATABASE_PRINCIPAL_ID(N'MailqSender') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqSender DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqSender');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqSender;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
IF DATABASE_PRINCIPAL_ID(N'MailqEnqueuer') IS NOT NULL
BEGIN
    DECLARE @DropMembers NVARCHAR(MAX) = N'';
    SELECT @DropMembers += N'ALTER ROLE MailqEnqueuer DROP MEMBER ' + QUOTENAME(m.name) + N';'
    FROM sys.database_role_members AS rm
    INNER JOIN sys.database_principals AS m ON m.principal_id = rm.member_principal_id
    WHERE rm.role_principal_id = DATABASE_PRINCIPAL_ID(N'MailqEnqueuer');
    EXEC sys.sp_executesql @DropMembers;
    DROP ROLE MailqEnqueuer;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP SCHEMA IF EXISTS mailq;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DELETE FROM dbo.mailq_deployment_file WHERE Revision = '0001';
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DROP TABLE IF EXISTS dbo.mailq_deployment_file;
DROP TABLE IF EXISTS dbo.mailq_deployment_option;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DECLARE @Activation INT = CAST(SESSION_CONTEXT(N'mailq_db.activation') AS INT);
IF @Activation IS NOT NULL AND EXISTS (
    SELECT 1 FROM sys.service_queues AS q
    WHERE q.object_id = OBJECT_ID(N'dbo.DelayServiceQueue', N'SQ') AND q.activation_procedure IS NOT NULL)
BEGIN
    IF @Activation = 1
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = ON);
    ELSE
        ALTER QUEUE dbo.DelayServiceQueue WITH ACTIVATION (STATUS = OFF);
END;
EXEC sys.sp_set_session_context @key = N'mailq_db.activation', @value = NULL;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DELETE FROM dbo.mailq_alembic_version WHERE dbo.mailq_alembic_version.version_num = '0001';
GO
COMMIT;
GO
DECLARE @Reached VARCHAR(32);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Reached = MAX(version_num) FROM dbo.mailq_alembic_version;
PRINT CONCAT(N'mailq-db: database ', QUOTENAME(DB_NAME()), N' is now at revision ',
    ISNULL(@Reached, N'base (no revision)'), N'.');
GO
SET NOEXEC OFF;
GO
IF APPLOCK_MODE(N'public', N'mailq-db deploy', N'Session') = N'Exclusive'
    EXEC sys.sp_releaseapplock @Resource = N'mailq-db deploy', @LockOwner = N'Session';
GO
