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
    SET @Msg = CONCAT(N'The deployment creates schemas, roles, tables: the login ',
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

IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NULL
CREATE TABLE dbo.mailq_alembic_version (
    version_num VARCHAR(32) NOT NULL, 
    CONSTRAINT mailq_alembic_version_pkc PRIMARY KEY (version_num)
);
GO
-- Running upgrade  -> 0001

SET ANSI_NULLS, ANSI_PADDING, ANSI_WARNINGS, ARITHABORT, CONCAT_NULL_YIELDS_NULL, QUOTED_IDENTIFIER ON;
SET NUMERIC_ROUNDABORT OFF;
SET NOCOUNT, XACT_ABORT ON;
GO
DECLARE @Current VARCHAR(32), @Rows INT = 0, @Msg NVARCHAR(2048);
IF OBJECT_ID(N'dbo.mailq_alembic_version', N'U') IS NOT NULL
    SELECT @Rows = COUNT(*), @Current = MAX(version_num) FROM dbo.mailq_alembic_version;
IF @Rows = 1 AND @Current = '0001'
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
IF NOT (@Rows = 0)
BEGIN
    SET @Msg = CONCAT(N'Revision 0001 upgrades a database at no revision (an empty database); ', QUOTENAME(DB_NAME()),
        N' is at ', IIF(@Rows > 1, N'several revisions', ISNULL(@Current, N'no revision')),
        N'. Render the script for this database with: ', IIF(@Current IS NULL, N'mailq-db deploy --sql', CONCAT(N'mailq-db deploy --sql --revision ', @Current, N':head')),
        N' (or apply online with mailq-db deploy, which picks the revisions itself).');
    THROW 50410, @Msg, 1;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DECLARE @Stored NVARCHAR(400), @Msg NVARCHAR(2048);
SELECT @Stored = Value FROM dbo.mailq_deployment_option WHERE Name = N'broker';
IF @Stored = N'on'
BEGIN
    SET @Msg = CONCAT(N'Database ', QUOTENAME(DB_NAME()), N' has delayed execution (stored option broker=on); this script was rendered with -x broker=off and would leave its objects at an old revision. Render it without -x broker=off.');
    THROW 50414, @Msg, 1;
END;
UPDATE dbo.mailq_deployment_option SET Value = N'off', ChangedAtUtc = SYSUTCDATETIME() WHERE Name = N'broker' AND Value <> N'off';
IF NOT EXISTS (SELECT 1 FROM dbo.mailq_deployment_option WHERE Name = N'broker')
    INSERT INTO dbo.mailq_deployment_option (Name, Value) VALUES (N'broker', N'off');
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Deployment pre-check (the baseline's first file; creates and changes nothing):
    50402  database compatibility level below 130 (OPENJSON, STRING_SPLIT)
    50403  SQL Server older than 2019 (major version 15) outside Azure
*/
DECLARE @CompatibilityLevel INT = (
    SELECT d.compatibility_level
    FROM sys.databases AS d
    WHERE d.database_id = DB_ID()
);
DECLARE @EngineEdition INT = CAST(SERVERPROPERTY(N'EngineEdition') AS INT);
DECLARE @MajorVersion INT = CAST(SERVERPROPERTY(N'ProductMajorVersion') AS INT);
DECLARE @Msg NVARCHAR(2048);
IF @CompatibilityLevel < 130
BEGIN
    SET @Msg = CONCAT(
        N'mailq-db needs database compatibility level 130 or higher (OPENJSON, STRING_SPLIT); ',
        N'database ', QUOTENAME(DB_NAME()), N' has ', @CompatibilityLevel, N'. ',
        N'A DBA can raise it with: ALTER DATABASE ', QUOTENAME(DB_NAME()),
        N' SET COMPATIBILITY_LEVEL = 150; (test the application first: the level changes query optimisation).'
    );
    THROW 50402, @Msg, 1;
END;
-- EngineEdition 5, 8: Azure SQL Database and Managed Instance (versionless).
IF @EngineEdition NOT IN (5, 8) AND @MajorVersion < 15
BEGIN
    SET @Msg = CONCAT(
        N'mailq-db needs SQL Server 2019 (major version 15) or later; this server reports ',
        @MajorVersion, N'.'
    );
    THROW 50403, @Msg, 1;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Schema mailq: every object of the mail queue, owned by dbo (ownership chaining:
callers hold only EXECUTE).  Sent as IF SCHEMA_ID(...) IS NULL EXEC (...).
*/
IF SCHEMA_ID(N'mailq') IS NULL
    EXEC (N'CREATE SCHEMA mailq AUTHORIZATION dbo');
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqEnqueuer: may only enqueue mail (EXECUTE mailq.EnqueueMail).
No role holds table rights (ownership chaining from dbo-owned procedures).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqEnqueuer') IS NULL
    CREATE ROLE MailqEnqueuer AUTHORIZATION dbo;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqSender: sender workers: claim, extend, release and acknowledge mail, read health.
No role holds table rights (ownership chaining from dbo-owned procedures).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqSender') IS NULL
    CREATE ROLE MailqSender AUTHORIZATION dbo;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqAdmin: administration: every mailq procedure (requeue, cancel, purge, accounts, stats).
No role holds table rights (ownership chaining from dbo-owned procedures).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqAdmin') IS NULL
    CREATE ROLE MailqAdmin AUTHORIZATION dbo;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqDelayCaller: may only call dbo.InitiateDelayExecution and dbo.CancelDelayExecution (grants in sql/broker/).
No role holds table rights (ownership chaining from dbo-owned procedures).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqDelayCaller') IS NULL
    CREATE ROLE MailqDelayCaller AUTHORIZATION dbo;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
User MailqRunner (WITHOUT LOGIN; only dbo and db_owner may impersonate it): the
identity every delayed-execution target (delay.RunTask) and hook
(mailq.RunApplicationHooks) runs as, EXECUTE AS USER ... REVERT, never as dbo.
It holds EXECUTE on exactly the allowed targets and registered hooks (granted by
delay.AllowProcedure and mailq.SetApplicationHook) and nothing else.
*/
IF DATABASE_PRINCIPAL_ID(N'MailqRunner') IS NULL
    CREATE USER MailqRunner WITHOUT LOGIN;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.SendingAccount: one row per sending account; SMTP host and credentials live
in the worker's configuration.  Per*Limit NULL = unlimited, enforced at claim
across workers (mailq.RateBudget).  BlockedUntilUtc: set by MarkFailed 'Wait'.
IsDefault: EnqueueMail's account when none is named.  MinLoginIntervalMs: least
time between two SMTP logins (mailq.AcquireLoginSlot; LastLoginAtUtc).
*/
IF OBJECT_ID(N'mailq.SendingAccount', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.SendingAccount (
        AccountName NVARCHAR(128) NOT NULL,
        DefaultFromAddress NVARCHAR(320) NOT NULL,
        DefaultFromName NVARCHAR(200) NULL,
        PerMinuteLimit INT NULL,
        PerHourLimit INT NULL,
        PerDayLimit INT NULL,
        BlockedUntilUtc DATETIME2(3) NULL,
        BlockReason NVARCHAR(4000) NULL,
        IsDefault BIT NOT NULL CONSTRAINT DF_SendingAccount_IsDefault DEFAULT (0),
        MinLoginIntervalMs INT NULL,
        LastLoginAtUtc DATETIME2(3) NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_SendingAccount_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_SendingAccount PRIMARY KEY CLUSTERED (AccountName),
        CONSTRAINT CK_SendingAccount_Limits CHECK (
            (PerMinuteLimit IS NULL OR PerMinuteLimit > 0)
            AND (PerHourLimit IS NULL OR PerHourLimit > 0)
            AND (PerDayLimit IS NULL OR PerDayLimit > 0)
        ),
        CONSTRAINT CK_SendingAccount_LoginInterval CHECK (
            MinLoginIntervalMs IS NULL OR MinLoginIntervalMs BETWEEN 1 AND 86400000
        )
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RateBudget: one row per sending account: its budget in fixed UTC windows
(minute, hour, day), charged by mailq.ClaimMail in the claim's transaction; apart
from mailq.SendingAccount so the claim's UPDLOCK never blocks its readers.  A
window whose start is not the current one counts as empty.
*/
IF OBJECT_ID(N'mailq.RateBudget', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.RateBudget (
        AccountName NVARCHAR(128) NOT NULL,
        MinuteStartUtc DATETIME2(0) NOT NULL
        CONSTRAINT DF_RateBudget_MinuteStartUtc DEFAULT ('2000-01-01'),
        MinuteCount INT NOT NULL CONSTRAINT DF_RateBudget_MinuteCount DEFAULT (0),
        HourStartUtc DATETIME2(0) NOT NULL
        CONSTRAINT DF_RateBudget_HourStartUtc DEFAULT ('2000-01-01'),
        HourCount INT NOT NULL CONSTRAINT DF_RateBudget_HourCount DEFAULT (0),
        DayStartUtc DATETIME2(0) NOT NULL
        CONSTRAINT DF_RateBudget_DayStartUtc DEFAULT ('2000-01-01'),
        DayCount INT NOT NULL CONSTRAINT DF_RateBudget_DayCount DEFAULT (0),
        CONSTRAINT PK_RateBudget PRIMARY KEY CLUSTERED (AccountName),
        CONSTRAINT FK_RateBudget_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName),
        CONSTRAINT CK_RateBudget_Counts CHECK (MinuteCount >= 0 AND HourCount >= 0 AND DayCount >= 0)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.Application: application names a mail may carry; an isolated worker claims
one application's mail.  DryRun: 1 = recorded as DryRun, reaching no server
(docs/run-modes.md).
*/
IF OBJECT_ID(N'mailq.Application', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.Application (
        AppName NVARCHAR(128) NOT NULL,
        Description NVARCHAR(400) NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_Application_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        DryRun BIT NOT NULL CONSTRAINT DF_Application_DryRun DEFAULT (0),
        CONSTRAINT PK_Application PRIMARY KEY CLUSTERED (AppName)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailQueue: one row per mail (docs/dba-guide.md, "Tables").
Status: UnSent -> Sending (leased) -> Sent | Failed | Cancelled | Expired |
Stopped; every change writes a mailq.MailEvent row in the same transaction.
VisibleAtUtc  the due time while UnSent, the lease expiry while Sending.
ThreadLock    the lease token every acknowledgement is fenced by.
AttemptsRemaining / AttemptCount  spent at claim; Wait and Release refund.
PossibleDuplicate  an expired lease was reclaimed, or no reply came after the final dot.
Options: bodies out of row; LOCK_ESCALATION = DISABLE (docs/dba-guide.md).
*/
IF OBJECT_ID(N'mailq.MailQueue', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailQueue (
        ID BIGINT IDENTITY (1, 1) NOT NULL,
        dtStamp DATETIME2(3) NOT NULL CONSTRAINT DF_MailQueue_dtStamp DEFAULT (SYSUTCDATETIME()),
        DateToProcess DATETIME2(3) NOT NULL,
        DateProcessed DATETIME2(3) NULL,
        VisibleAtUtc DATETIME2(3) NOT NULL,
        FromName NVARCHAR(200) NULL,
        FromAddress NVARCHAR(320) NOT NULL,
        ReplyTo NVARCHAR(320) NULL,
        ToAddress NVARCHAR(4000) NOT NULL,
        CC NVARCHAR(4000) NULL,
        BCC NVARCHAR(4000) NULL,
        Subject NVARCHAR(900) NOT NULL,
        Body NVARCHAR(MAX) NOT NULL,
        BodyFormat NVARCHAR(8) NOT NULL CONSTRAINT DF_MailQueue_BodyFormat DEFAULT (N'Text'),
        TextBody NVARCHAR(MAX) NULL,
        Headers NVARCHAR(MAX) NULL,
        Status NVARCHAR(16) NOT NULL CONSTRAINT DF_MailQueue_Status DEFAULT (N'UnSent'),
        ThreadLock UNIQUEIDENTIFIER NULL,
        AttemptsRemaining INT NOT NULL,
        AttemptCount INT NOT NULL CONSTRAINT DF_MailQueue_AttemptCount DEFAULT (0),
        Priority TINYINT NOT NULL CONSTRAINT DF_MailQueue_Priority DEFAULT (5),
        AccountName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NULL,
        IdempotencyKey NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NULL,
        ContentHash VARBINARY(32) NOT NULL,
        MessageID NVARCHAR(255) NOT NULL,
        ExpiresAtUtc DATETIME2(3) NULL,
        SentAtUtc DATETIME2(3) NULL,
        LastError NVARCHAR(4000) NULL,
        PossibleDuplicate BIT NOT NULL CONSTRAINT DF_MailQueue_PossibleDuplicate DEFAULT (0),
        DryRun BIT NOT NULL CONSTRAINT DF_MailQueue_DryRun DEFAULT (0),
        RunMode NVARCHAR(32) NOT NULL CONSTRAINT DF_MailQueue_RunMode DEFAULT (N'prod'),
        TemplateName NVARCHAR(128) NULL,
        TemplateVersion INT NULL,
        TemplateModel NVARCHAR(MAX) NULL,
        CONSTRAINT PK_MailQueue PRIMARY KEY CLUSTERED (ID),
        CONSTRAINT FK_MailQueue_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName),
        CONSTRAINT FK_MailQueue_Application FOREIGN KEY (AppName)
        REFERENCES mailq.Application (AppName),
        CONSTRAINT CK_MailQueue_Status CHECK (
            Status IN (N'UnSent', N'Sending', N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
        ),
        CONSTRAINT CK_MailQueue_Lease CHECK (
            (Status = N'Sending' AND ThreadLock IS NOT NULL)
            OR (Status <> N'Sending' AND ThreadLock IS NULL)
        ),
        CONSTRAINT CK_MailQueue_Priority CHECK (Priority BETWEEN 0 AND 9),
        CONSTRAINT CK_MailQueue_BodyFormat CHECK (BodyFormat IN (N'Text', N'Html')),
        CONSTRAINT CK_MailQueue_Attempts CHECK (AttemptsRemaining >= 0 AND AttemptCount >= 0),
        CONSTRAINT CK_MailQueue_Headers CHECK (Headers IS NULL OR ISJSON(Headers) = 1),
        CONSTRAINT CK_MailQueue_Expiry CHECK (ExpiresAtUtc IS NULL OR ExpiresAtUtc > DateToProcess),
        CONSTRAINT CK_MailQueue_RunMode CHECK (
            LEN(RunMode) BETWEEN 1 AND 32
            AND RunMode COLLATE Latin1_General_100_BIN2 LIKE N'[a-z]%'
            AND RunMode COLLATE Latin1_General_100_BIN2 NOT LIKE N'%[^a-z0-9_-]%'
        ),
        CONSTRAINT CK_MailQueue_Template CHECK (
            (TemplateName IS NULL AND TemplateVersion IS NULL AND TemplateModel IS NULL)
            OR (
                TemplateName IS NOT NULL AND TemplateModel IS NOT NULL AND ISJSON(TemplateModel) = 1
                AND (TemplateVersion IS NULL OR TemplateVersion >= 1)
            )
        )
    );
    EXEC sys.sp_tableoption N'mailq.MailQueue', 'large value types out of row', 1;
    -- Dynamic SQL: sqlfluff's tsql dialect does not parse SET (LOCK_ESCALATION = ...).
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailQueue SET (LOCK_ESCALATION = DISABLE);';
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailAttachment: attachments of a mail, in order: Content, or a Generator
(mailq_db.attachment_generators) with GeneratorArgs, never both (docs/templates.md).
LOCK_ESCALATION = DISABLE (docs/dba-guide.md, section 7).
*/
IF OBJECT_ID(N'mailq.MailAttachment', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailAttachment (
        MailID BIGINT NOT NULL,
        AttachmentNo INT NOT NULL,
        FileName NVARCHAR(255) NOT NULL,
        ContentType NVARCHAR(255) NOT NULL
        CONSTRAINT DF_MailAttachment_ContentType DEFAULT (N'application/octet-stream'),
        Content VARBINARY(MAX) NULL,
        Generator NVARCHAR(128) NULL,
        GeneratorArgs NVARCHAR(MAX) NULL,
        CONSTRAINT PK_MailAttachment PRIMARY KEY CLUSTERED (MailID, AttachmentNo),
        CONSTRAINT FK_MailAttachment_MailQueue FOREIGN KEY (MailID)
        REFERENCES mailq.MailQueue (ID),
        CONSTRAINT CK_MailAttachment_Size CHECK (DATALENGTH(Content) <= 10485760),
        CONSTRAINT CK_MailAttachment_No CHECK (AttachmentNo BETWEEN 1 AND 10),
        CONSTRAINT CK_MailAttachment_FileName CHECK (
            LEN(FileName) > 0 AND FileName NOT LIKE N'%[/\:]%'
        ),
        CONSTRAINT CK_MailAttachment_Source CHECK (
            (Content IS NOT NULL AND Generator IS NULL AND GeneratorArgs IS NULL)
            OR (
                Content IS NULL AND Generator IS NOT NULL AND LEN(Generator) > 0
                AND (GeneratorArgs IS NULL OR ISJSON(GeneratorArgs) = 1)
            )
        )
    );
    -- Dynamic SQL: sqlfluff's tsql dialect does not parse SET (LOCK_ESCALATION = ...).
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailAttachment SET (LOCK_ESCALATION = DISABLE);';
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailAttempt: one row per attempt, opened by mailq.ClaimMail, closed by the
acknowledgement or, after an expired lease, by the next claim ('Abandoned').
Outcome: Sent, DryRun, Retry, Wait, Stop, Released, Abandoned; NULL while open.
*/
IF OBJECT_ID(N'mailq.MailAttempt', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailAttempt (
        MailID BIGINT NOT NULL,
        AttemptNo INT NOT NULL,
        LockToken UNIQUEIDENTIFIER NOT NULL,
        WorkerName NVARCHAR(128) NULL,
        StartedAtUtc DATETIME2(3) NOT NULL,
        EndedAtUtc DATETIME2(3) NULL,
        Outcome NVARCHAR(16) NULL,
        SmtpCode INT NULL,
        ErrorText NVARCHAR(4000) NULL,
        TemplateVersion INT NULL,
        CONSTRAINT PK_MailAttempt PRIMARY KEY CLUSTERED (MailID, AttemptNo),
        CONSTRAINT FK_MailAttempt_MailQueue FOREIGN KEY (MailID)
        REFERENCES mailq.MailQueue (ID),
        CONSTRAINT CK_MailAttempt_Outcome CHECK (
            Outcome IS NULL
            OR Outcome IN (N'Sent', N'DryRun', N'Retry', N'Wait', N'Stop', N'Released', N'Abandoned')
        )
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ApplicationAccount: the sending accounts an application may send through
(else EnqueueMail refuses, 50160).
*/
IF OBJECT_ID(N'mailq.ApplicationAccount', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationAccount (
        AppName NVARCHAR(128) NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationAccount_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_ApplicationAccount PRIMARY KEY CLUSTERED (AppName, AccountName),
        CONSTRAINT FK_ApplicationAccount_Application FOREIGN KEY (AppName)
        REFERENCES mailq.Application (AppName),
        CONSTRAINT FK_ApplicationAccount_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ApplicationFrom: the From addresses and domains an application may send as
(else 50161).  FromPattern: an address or '@domain' (not its subdomains), lower
case, binary collation.
*/
IF OBJECT_ID(N'mailq.ApplicationFrom', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationFrom (
        AppName NVARCHAR(128) NOT NULL,
        FromPattern NVARCHAR(320) COLLATE Latin1_General_100_BIN2 NOT NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationFrom_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_ApplicationFrom PRIMARY KEY CLUSTERED (AppName, FromPattern),
        CONSTRAINT FK_ApplicationFrom_Application FOREIGN KEY (AppName)
        REFERENCES mailq.Application (AppName),
        CONSTRAINT CK_ApplicationFrom_Lower CHECK (FromPattern = LOWER(FromPattern) AND LEN(FromPattern) > 1)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ApplicationPrincipal: which application a database user enqueues as: its
mail carries that application (another @AppName: 50168) and its bindings apply.
*/
IF OBJECT_ID(N'mailq.ApplicationPrincipal', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationPrincipal (
        PrincipalName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationPrincipal_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_ApplicationPrincipal PRIMARY KEY CLUSTERED (PrincipalName),
        CONSTRAINT FK_ApplicationPrincipal_Application FOREIGN KEY (AppName)
        REFERENCES mailq.Application (AppName)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.EnqueuePolicy: who may enqueue without an application, one row.
    AllowUnmappedEnqueuers  0 (a new installation): a database user that no
        mailq.ApplicationPrincipal row maps to an application is refused by
        EnqueueMail, EnqueueMailBatch and SendDbMail (50500); 1: the opt-in of
        mailq.SetEnqueuePolicy, such a user enqueues unbound.
    ChangedAtUtc, ChangedBy  when and by whom (ORIGINAL_LOGIN()) it was last set.
Written only by mailq.SetEnqueuePolicy; read by the enqueue core
(mailq.EnqueueMailRows) and mailq.GetEnqueuePolicy (docs/enqueue.md, "Who may
send as whom").
*/
IF OBJECT_ID(N'mailq.EnqueuePolicy', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.EnqueuePolicy (
        PolicyId TINYINT NOT NULL CONSTRAINT DF_EnqueuePolicy_PolicyId DEFAULT (1),
        AllowUnmappedEnqueuers BIT NOT NULL CONSTRAINT DF_EnqueuePolicy_AllowUnmapped DEFAULT (0),
        ChangedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_EnqueuePolicy_ChangedAtUtc DEFAULT (SYSUTCDATETIME()),
        ChangedBy NVARCHAR(128) NULL,
        CONSTRAINT PK_EnqueuePolicy PRIMARY KEY CLUSTERED (PolicyId),
        CONSTRAINT CK_EnqueuePolicy_SingleRow CHECK (PolicyId = 1)
    );
    INSERT INTO mailq.EnqueuePolicy (PolicyId, AllowUnmappedEnqueuers) VALUES (1, 0);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_MailQueue_ClaimByAccount: mailq.ClaimMail's seek per (account, run mode); page
locks stay allowed (REORGANIZE needs them).  Plan and cost: docs/dba-guide.md.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_ClaimByAccount' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount
    ON mailq.MailQueue (AccountName ASC, RunMode ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
    INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc)
    WHERE Status IN (N'UnSent', N'Sending');
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_MailQueue_Finalize: mailq.FinalizeMail's last-attempt step (lease expired -> Failed).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Finalize' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_Finalize
    ON mailq.MailQueue (VisibleAtUtc ASC, ID ASC)
    WHERE Status IN (N'UnSent', N'Sending') AND AttemptsRemaining = 0;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_MailQueue_Expiry: mailq.FinalizeMail's expiry step (queued mail past ExpiresAtUtc).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Expiry' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_Expiry
    ON mailq.MailQueue (ExpiresAtUtc ASC, ID ASC)
    INCLUDE (VisibleAtUtc)
    WHERE Status IN (N'UnSent', N'Sending') AND ExpiresAtUtc IS NOT NULL;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailRecipientOutcome: one row per (mail, lower-case address) when a server
accepted a mail for some recipients only, replaced by later attempts until final.
Outcome: Delivered (never sent again), Deferred (4xx: retried with the mail),
Refused (5xx: final).  PurgeMail deletes them first; ON DELETE CASCADE otherwise.
*/
IF OBJECT_ID(N'mailq.MailRecipientOutcome', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailRecipientOutcome (
        MailID BIGINT NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        Outcome NVARCHAR(16) NOT NULL,
        SmtpCode INT NULL,
        SmtpText NVARCHAR(1000) NULL,
        AttemptNo INT NOT NULL,
        UpdatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_MailRecipientOutcome_UpdatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_MailRecipientOutcome PRIMARY KEY CLUSTERED (MailID, Address),
        CONSTRAINT FK_MailRecipientOutcome_MailQueue FOREIGN KEY (MailID)
        REFERENCES mailq.MailQueue (ID) ON DELETE CASCADE,
        CONSTRAINT CK_MailRecipientOutcome_Outcome CHECK (Outcome IN (N'Delivered', N'Deferred', N'Refused')),
        CONSTRAINT CK_MailRecipientOutcome_SmtpCode CHECK (SmtpCode IS NULL OR SmtpCode BETWEEN 200 AND 599)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
UX_MailQueue_IdempotencyKey: one mail per idempotency key (binary); filtered, so
mail without a key costs nothing.  Enqueues serialize on an applock on the key.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'UX_MailQueue_IdempotencyKey' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE UNIQUE NONCLUSTERED INDEX UX_MailQueue_IdempotencyKey
    ON mailq.MailQueue (IdempotencyKey)
    WHERE IdempotencyKey IS NOT NULL;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_MailQueue_Final: mailq.PurgeMail's range seek on the oldest final mail.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Final' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailQueue_Final
    ON mailq.MailQueue (DateProcessed ASC, ID ASC)
    INCLUDE (Status, AccountName)
    WHERE Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped');
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_MailAttempt_EndedAtUtc: closed attempts by end time, for the reporting views.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailAttempt_EndedAtUtc' AND object_id = OBJECT_ID(N'mailq.MailAttempt')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailAttempt_EndedAtUtc
    ON mailq.MailAttempt (EndedAtUtc ASC)
    INCLUDE (Outcome, SmtpCode)
    WHERE EndedAtUtc IS NOT NULL;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
UX_SendingAccount_IsDefault: at most one default sending account.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'UX_SendingAccount_IsDefault' AND object_id = OBJECT_ID(N'mailq.SendingAccount')
)
BEGIN
    CREATE UNIQUE NONCLUSTERED INDEX UX_SendingAccount_IsDefault
    ON mailq.SendingAccount (IsDefault)
    WHERE IsDefault = 1;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_MailQueue_Status: the narrow, unfiltered index the counts read (QueueCountsByStatus,
OldestDueMail), never the clustered index.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Status' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailQueue_Status
    ON mailq.MailQueue (Status ASC, AccountName ASC, VisibleAtUtc ASC);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailEvent: the append-only event stream: one row per state change of a mail,
in its transaction (docs/events.md); deleted only with the mail by PurgeMail.
EventSeq      ROWVERSION, read below MIN_ACTIVE_ROWVERSION() by mailq.GetMailEvents
              (as EventID BIGINT): a commit-safe cursor.
Status, AttemptCount  the mail's, right after the change.
No CHECK, foreign key or trigger: procedures write it by OUTPUT ... INTO.
LOCK_ESCALATION = DISABLE (docs/dba-guide.md, section 7).
*/
IF OBJECT_ID(N'mailq.MailEvent', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailEvent (
        EventSeq ROWVERSION NOT NULL,
        MailID BIGINT NOT NULL,
        AppName NVARCHAR(128) NULL,
        EventType NVARCHAR(32) NOT NULL,
        Status NVARCHAR(16) NOT NULL,
        AttemptCount INT NOT NULL,
        SmtpCode INT NULL,
        Detail NVARCHAR(4000) NULL,
        OccurredAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_MailEvent_OccurredAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_MailEvent PRIMARY KEY CLUSTERED (EventSeq)
    );
    -- Dynamic SQL: sqlfluff's tsql dialect does not parse SET (LOCK_ESCALATION = ...).
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailEvent SET (LOCK_ESCALATION = DISABLE);';
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_MailEvent_AppName: mailq.GetMailEvents @AppName: events after the cursor in
one range seek; Detail by key lookup (at most @MaxEvents).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailEvent_AppName' AND object_id = OBJECT_ID(N'mailq.MailEvent')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailEvent_AppName
    ON mailq.MailEvent (AppName ASC, EventSeq ASC)
    INCLUDE (MailID, EventType, Status, AttemptCount, SmtpCode, OccurredAtUtc);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_MailEvent_MailID: mailq.GetMailEvents @MailID and mailq.PurgeMail (a seek per mail).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailEvent_MailID' AND object_id = OBJECT_ID(N'mailq.MailEvent')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailEvent_MailID
    ON mailq.MailEvent (MailID ASC, EventSeq ASC);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ApplicationHook: an application's hook procedure and the dispatcher's cursor
(docs/hooks.md).  SchemaName, ProcedureName, ObjectId, DefinitionHash: the pin (it
runs only while that procedure is unchanged).  CursorEventID: the last event
handled or given up.  FailingEventID, FailCount: the event failing, how often.
*/
IF OBJECT_ID(N'mailq.ApplicationHook', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationHook (
        AppName NVARCHAR(128) NOT NULL,
        SchemaName SYSNAME NOT NULL,
        ProcedureName SYSNAME NOT NULL,
        ObjectId INT NOT NULL,
        DefinitionHash VARBINARY(32) NOT NULL,
        MaxAttempts INT NOT NULL
        CONSTRAINT DF_ApplicationHook_MaxAttempts DEFAULT (3),
        CursorEventID BIGINT NOT NULL
        CONSTRAINT DF_ApplicationHook_CursorEventID DEFAULT (0),
        FailingEventID BIGINT NULL,
        FailCount INT NOT NULL
        CONSTRAINT DF_ApplicationHook_FailCount DEFAULT (0),
        LastError NVARCHAR(4000) NULL,
        LastRunAtUtc DATETIME2(3) NULL,
        RegisteredAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationHook_RegisteredAtUtc DEFAULT (SYSUTCDATETIME()),
        RegisteredBy NVARCHAR(128) NOT NULL
        CONSTRAINT DF_ApplicationHook_RegisteredBy DEFAULT (ORIGINAL_LOGIN()),
        CONSTRAINT PK_ApplicationHook PRIMARY KEY CLUSTERED (AppName),
        CONSTRAINT FK_ApplicationHook_Application FOREIGN KEY (AppName) REFERENCES mailq.Application (AppName),
        CONSTRAINT CK_ApplicationHook_MaxAttempts CHECK (MaxAttempts BETWEEN 1 AND 100),
        CONSTRAINT CK_ApplicationHook_FailCount CHECK (FailCount >= 0)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ApplicationHookFailure: events a hook gave up on (docs/hooks.md): after
MaxAttempts failed calls, or at once on 266 (the hook ended our transaction);
the cursor moves past them.  History: nothing deletes rows.
*/
IF OBJECT_ID(N'mailq.ApplicationHookFailure', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationHookFailure (
        FailureID BIGINT IDENTITY (1, 1) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        EventID BIGINT NOT NULL,
        MailID BIGINT NOT NULL,
        EventType NVARCHAR(32) NOT NULL,
        HookProcedure NVARCHAR(300) NOT NULL,
        Attempts INT NOT NULL,
        ErrorNumber INT NULL,
        ErrorMessage NVARCHAR(4000) NULL,
        RecordedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationHookFailure_RecordedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_ApplicationHookFailure PRIMARY KEY CLUSTERED (FailureID)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_MailQueue_ClaimByApp: mailq.ClaimMail's seek for an isolated worker (@AppName
set), per (account, run mode); ClaimMail repeats the filter's literals.
Plan and why a second index: docs/claim.md.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_ClaimByApp' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByApp
    ON mailq.MailQueue (AccountName ASC, RunMode ASC, AppName ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
    INCLUDE (AttemptsRemaining, ExpiresAtUtc)
    WHERE Status IN (N'UnSent', N'Sending') AND AppName IS NOT NULL;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ParseAddressList: splits a ';'-separated recipient list and says what is
wrong with each entry (inline).  An entry is an address or 'Name <address>'.
Parameters:  @List NVARCHAR(MAX), NULL gives no rows
Returns:     DisplayName (NULL for a bare address), Address, Problem NVARCHAR(100)
             (NULL when acceptable); entries trimmed, empty ones skipped.
Rules:       no control character (header injection); display name without '<'
             or '>', at most 200 characters; address without white space, at
             most 254 characters, one '@' between a non-empty local part and
             domain, none of < > , " ( ) \, domain not starting or ending with
             '.' nor containing '..'.  Non-ASCII is accepted (SMTPUTF8 needed).
Example:     SELECT a.Address, a.Problem FROM mailq.ParseAddressList(N'a@x.org; c@') AS a;
*/
CREATE OR ALTER FUNCTION mailq.ParseAddressList(@List NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN
SELECT
    p.DisplayName,
    p.Address,
    CASE
        -- Binary collation: LIKE ranges are code points, control characters never ignored.
        WHEN p.Entry COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%'
            THEN N'contains CR, LF or another control character'
        WHEN p.DisplayName LIKE N'%[<>]%' THEN N'has a malformed display name'
        WHEN LEN(p.DisplayName) > 200 THEN N'has a display name longer than 200 characters'
        WHEN p.Address LIKE N'% %' OR p.Address LIKE N'%' + NCHAR(160) + N'%'
            THEN N'contains white space'
        WHEN LEN(p.Address) > 254 THEN N'is longer than 254 characters'
        WHEN p.Address NOT LIKE N'%_@_%' THEN N'has no local part or no domain'
        WHEN p.Address LIKE N'%@%@%' THEN N'has more than one @'
        WHEN p.Address LIKE N'%[<>,"()\]%' THEN N'contains a character not allowed in an address'
        WHEN p.Address LIKE N'%@.%' OR p.Address LIKE N'%.' OR p.Address LIKE N'%@%..%'
            THEN N'has a malformed domain'
    END AS Problem
FROM (
    SELECT
        e.Entry,
        -- "Name <address>": the display name is what stands before the first '<'.
        IIF(
            e.Entry LIKE N'%<%>',
            NULLIF(RTRIM(LEFT(e.Entry, CHARINDEX(N'<', e.Entry) - 1)), N''),
            NULL
        ) AS DisplayName,
        IIF(
            e.Entry LIKE N'%<%>',
            SUBSTRING(e.Entry, CHARINDEX(N'<', e.Entry) + 1, LEN(e.Entry) - CHARINDEX(N'<', e.Entry) - 1),
            e.Entry
        ) AS Address
    FROM (
        SELECT LTRIM(RTRIM(s.value)) AS Entry
        FROM STRING_SPLIT(@List, N';') AS s
    ) AS e
    WHERE e.Entry <> N''
) AS p;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ParseIDList: the distinct mail IDs of a procedure's @ID or @IDList (a JSON
array of integers, validated by the caller: mailq.LockLeasedMail).
Returns:     ID BIGINT.
Example:     SELECT l.ID FROM mailq.ParseIDList(NULL, N'[1, 2, 3]') AS l;
*/
CREATE OR ALTER FUNCTION mailq.ParseIDList(@ID BIGINT, @IDList NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN (
    SELECT @ID AS ID
    WHERE @ID IS NOT NULL
    UNION
    SELECT TRY_CAST(j.[value] AS BIGINT) AS ID
    FROM OPENJSON(@IDList) AS j
    WHERE j.[type] = 2 AND TRY_CAST(j.[value] AS BIGINT) IS NOT NULL
);
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.HookPin: the registered hook as it is now, if still the procedure that was
registered (same object_id, schema, name, owner dbo, SHA2_256 of its definition);
no row otherwise.  RunApplicationHooks reads it before and after every call: the
same ModifyDate means nothing altered the hook in between (docs/hooks.md).
Parameters:  @ObjectId INT, @SchemaName SYSNAME, @ProcedureName SYSNAME,
             @DefinitionHash VARBINARY(32): mailq.ApplicationHook's pin
Result set:  zero or one row: ModifyDate DATETIME (sys.objects.modify_date)
Security:    the catalog shows only what the caller may see: read as dbo.
Example:     SELECT ModifyDate FROM mailq.HookPin(@ObjectId, N'billing', N'OnMailEvent', @Hash);
*/
CREATE OR ALTER FUNCTION mailq.HookPin(
    @ObjectId INT,
    @SchemaName SYSNAME,
    @ProcedureName SYSNAME,
    @DefinitionHash VARBINARY(32)
)
RETURNS TABLE
AS
RETURN
SELECT ModifyDate = o.modify_date
FROM sys.objects AS o
INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
WHERE
    o.object_id = @ObjectId
    AND o.type = 'P'
    AND s.name = @SchemaName
    AND o.name = @ProcedureName
    AND s.principal_id = 1
    AND COALESCE(o.principal_id, 1) = 1
    AND HASHBYTES('SHA2_256', OBJECT_DEFINITION(o.object_id)) = @DefinitionHash;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.Suppression: addresses that a sending account (or one application on
it) must no longer mail (docs/bounces.md).  One row per (account, address,
application); AppName N'' means every application of the account.
Reason       HardBounce (the address does not exist: after the configured
             number of hard bounces, default 1), SoftBounce (after the
             configured number of soft bounces, off by default), Complaint
             (a spam complaint: at once, account-wide), Unsubscribe (the
             recipient asked: the application that sent the mail, or the
             whole account for mail without one), Manual (an operator).
Source, Detail  who or what added it and why (the report's status and text,
             the unsubscribe link, the operator's note).
MailID       the mail that caused it, if any (no foreign key: mail is purged,
             the suppression stays).
ExpiresAtUtc NULL: forever; else the row stops applying at that time.
Address is stored lower-case (the rule every enqueue compares with).
Written only by mailq.ApplySuppressions and mailq.RemoveSuppression; read by
mailq.FilterSuppressedRecipients at every enqueue (one seek per recipient).
*/
IF OBJECT_ID(N'mailq.Suppression', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.Suppression (
        AccountName NVARCHAR(128) NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AppName NVARCHAR(128) NOT NULL CONSTRAINT DF_Suppression_AppName DEFAULT (N''),
        Reason NVARCHAR(16) NOT NULL,
        Source NVARCHAR(200) NOT NULL,
        Detail NVARCHAR(1000) NULL,
        MailID BIGINT NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Suppression_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        UpdatedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Suppression_UpdatedAtUtc DEFAULT (SYSUTCDATETIME()),
        ExpiresAtUtc DATETIME2(3) NULL,
        CONSTRAINT PK_Suppression PRIMARY KEY CLUSTERED (AccountName, Address, AppName),
        CONSTRAINT FK_Suppression_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName),
        CONSTRAINT CK_Suppression_Reason CHECK (
            Reason IN (N'HardBounce', N'SoftBounce', N'Complaint', N'Unsubscribe', N'Manual')
        ),
        CONSTRAINT CK_Suppression_Address CHECK (Address = LOWER(Address) AND Address LIKE N'%_@_%')
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.SuppressionHistory: every addition, renewal and removal of a
suppression, with who did it and why (the audit an operator is asked for
when a customer says "I never unsubscribed").  Append-only; written by
mailq.ApplySuppressions and mailq.RemoveSuppression.
Action: Added, Renewed (an existing row got a new reason, source or
expiry), Removed.  AppName N'' as in mailq.Suppression.
*/
IF OBJECT_ID(N'mailq.SuppressionHistory', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.SuppressionHistory (
        HistoryID BIGINT IDENTITY (1, 1) NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        Action NVARCHAR(16) NOT NULL,
        Reason NVARCHAR(16) NOT NULL,
        Source NVARCHAR(200) NOT NULL,
        Detail NVARCHAR(1000) NULL,
        MailID BIGINT NULL,
        OccurredAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_SuppressionHistory_OccurredAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_SuppressionHistory PRIMARY KEY CLUSTERED (HistoryID),
        CONSTRAINT CK_SuppressionHistory_Action CHECK (Action IN (N'Added', N'Renewed', N'Removed'))
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.BounceReport: one row per (report, recipient) the bounce reader or
the unsubscribe endpoint recorded: the idempotency key of mailq.RecordBounce
(reading the same message twice records nothing new) and the history the
hard/soft bounce counts are taken from (docs/bounces.md).
ReportKey    SHA-256 of the report's Message-ID (else of its bytes), or of
             'unsubscribe:<mail>:<recipient>' for an unsubscribe.
Kind         Hard, Soft, Delayed, Complaint, Unsubscribe.
MailID       the mail the report is about (from its signed VERP token), NULL
             when the report could not be tied to a mail; no foreign key:
             mail is purged, the bounce history stays.
Action, Status, SmtpCode, Detail  the DSN's Action, enhanced status code,
             the SMTP reply code of its diagnostic, and its text.
*/
IF OBJECT_ID(N'mailq.BounceReport', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.BounceReport (
        ReportKey VARBINARY(32) NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NULL,
        MailID BIGINT NULL,
        Kind NVARCHAR(16) NOT NULL,
        Action NVARCHAR(16) NULL,
        Status NVARCHAR(16) NULL,
        SmtpCode INT NULL,
        Detail NVARCHAR(1000) NULL,
        Source NVARCHAR(200) NOT NULL,
        ReceivedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_BounceReport_ReceivedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_BounceReport PRIMARY KEY CLUSTERED (ReportKey, Address),
        CONSTRAINT CK_BounceReport_Kind CHECK (
            Kind IN (N'Hard', N'Soft', N'Delayed', N'Complaint', N'Unsubscribe')
        ),
        CONSTRAINT CK_BounceReport_SmtpCode CHECK (SmtpCode IS NULL OR SmtpCode BETWEEN 200 AND 599)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_BounceReport_Address: the bounce count of one address on one account
(mailq.RecordBounce compares it with @HardBounceLimit / @SoftBounceLimit):
one seek on (AccountName, Address, Kind).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_BounceReport_Address' AND object_id = OBJECT_ID(N'mailq.BounceReport')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_BounceReport_Address
    ON mailq.BounceReport (AccountName ASC, Address ASC, Kind ASC) INCLUDE (MailID);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_BounceReport_ReceivedAtUtc: recent reports by time (mailq.GetSuppressionStats,
the mailq.RecentBounceReports view) and the oldest ones first
(mailq.PurgeBounceReports): a range seek, never a scan of the history.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_BounceReport_ReceivedAtUtc' AND object_id = OBJECT_ID(N'mailq.BounceReport')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_BounceReport_ReceivedAtUtc
    ON mailq.BounceReport (ReceivedAtUtc ASC)
    INCLUDE (AccountName, Kind, MailID);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailRecipientList: the recipients of a mail in the order the worker
sends them: To, then CC, then BCC, each list in its written order (inline,
so it costs nothing outside the query).
Parameters:  @ToAddress, @CC, @BCC NVARCHAR(MAX): ';'-separated lists as
             mailq.EnqueueMail stores them; NULL lists give no rows.
Returns:     ListNo INT (1 To, 2 CC, 3 BCC), Position INT (0-based place in
             its list), Entry NVARCHAR(MAX) (trimmed, as written, display
             name included), Address NVARCHAR(MAX) (lower-case addr-spec),
             RecipientNo BIGINT (1-based number of the distinct address in
             send order: the number a VERP or unsubscribe token carries,
             mailq_db.bounces.verp), IsFirst INT (1 for an address's first
             entry, 0 for a repeat).  Empty entries are skipped.
Split:       OPENJSON over the list turned into a JSON array keeps the order
             (its [key]); STRING_SPLIT promises none before SQL Server 2022.
Example:     SELECT r.RecipientNo, r.Address
             FROM mailq.MailRecipientList(N'a@x.org; B <b@y.org>', NULL, N'a@x.org') AS r;
*/
CREATE OR ALTER FUNCTION mailq.MailRecipientList(
    @ToAddress NVARCHAR(MAX),
    @CC NVARCHAR(MAX),
    @BCC NVARCHAR(MAX)
)
RETURNS TABLE
AS
RETURN
SELECT
    e.ListNo,
    e.Position,
    e.Entry,
    e.Address,
    DENSE_RANK() OVER (ORDER BY e.FirstKey) AS RecipientNo,
    IIF(e.Occurrence = 1, 1, 0) AS IsFirst
FROM (
    SELECT
        p.ListNo,
        p.Position,
        p.Entry,
        p.Address,
        MIN(CAST(p.ListNo AS BIGINT) * 1000000 + p.Position) OVER (PARTITION BY p.Address) AS FirstKey,
        ROW_NUMBER() OVER (PARTITION BY p.Address ORDER BY p.ListNo, p.Position) AS Occurrence
    FROM (
        SELECT
            s.ListNo,
            s.Position,
            s.Entry,
            -- "Name <address>": the address is what stands between the first '<' and the final '>'.
            LOWER(IIF(
                s.Entry LIKE N'%<%>',
                SUBSTRING(s.Entry, CHARINDEX(N'<', s.Entry) + 1, LEN(s.Entry) - CHARINDEX(N'<', s.Entry) - 1),
                s.Entry
            )) AS Address
        FROM (
            SELECT
                l.ListNo,
                CAST(j.[key] AS INT) AS Position,
                LTRIM(RTRIM(j.[value])) AS Entry
            FROM (VALUES (1, @ToAddress), (2, @CC), (3, @BCC)) AS l(ListNo, List)
            CROSS APPLY OPENJSON(N'["' + REPLACE(STRING_ESCAPE(l.List, 'json'), N';', N'","') + N'"]') AS j
            WHERE l.List IS NOT NULL
        ) AS s
        WHERE s.Entry <> N''
    ) AS p
) AS e;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.FilterSuppressedRecipients: a mail's recipient lists without the addresses
suppressed for its account (AppName N'') or its application and not expired
(mailq.Suppression); inline, one seek on PK_Suppression per recipient entry.
Parameters:  @AccountName NVARCHAR(128), @AppName NVARCHAR(128) (NULL: none),
             @ToAddress, @CC, @BCC NVARCHAR(MAX) as stored.
Returns:     one row: SuppressedCount INT, EntriesLeft INT, ToAddress, CC, BCC
             (without them, '; ' joined, NULL when empty), Suppressed NVARCHAR(MAX).
Locking:     HOLDLOCK: in the caller's transaction the ranges read stay S-locked,
             so mailq.ApplySuppressions (insert, then sweep the queue) either waits
             for this mail and finds it, or committed first and is seen here.
Example:     SELECT f.ToAddress, f.Suppressed
             FROM mailq.FilterSuppressedRecipients(N'news', NULL, N'a@x.org', NULL, NULL) AS f;
*/
CREATE OR ALTER FUNCTION mailq.FilterSuppressedRecipients(
    @AccountName NVARCHAR(128),
    @AppName NVARCHAR(128),
    @ToAddress NVARCHAR(MAX),
    @CC NVARCHAR(MAX),
    @BCC NVARCHAR(MAX)
)
RETURNS TABLE
AS
RETURN
SELECT
    ISNULL(SUM(r.IsSuppressed), 0) AS SuppressedCount,
    ISNULL(SUM(1 - r.IsSuppressed), 0) AS EntriesLeft,
    STRING_AGG(IIF(r.ListNo = 1 AND r.IsSuppressed = 0, r.Entry, NULL), N'; ')
    WITHIN GROUP (ORDER BY r.ListNo, r.Position) AS ToAddress,
    STRING_AGG(IIF(r.ListNo = 2 AND r.IsSuppressed = 0, r.Entry, NULL), N'; ')
    WITHIN GROUP (ORDER BY r.ListNo, r.Position) AS CC,
    STRING_AGG(IIF(r.ListNo = 3 AND r.IsSuppressed = 0, r.Entry, NULL), N'; ')
    WITHIN GROUP (ORDER BY r.ListNo, r.Position) AS BCC,
    STRING_AGG(IIF(r.IsSuppressed = 1 AND r.IsFirst = 1, r.Address, NULL), N'; ')
    WITHIN GROUP (ORDER BY r.ListNo, r.Position) AS Suppressed
FROM (
    SELECT
        l.ListNo,
        l.Position,
        l.Entry,
        l.Address,
        l.IsFirst,
        IIF(EXISTS (
            SELECT 1
            FROM mailq.Suppression AS s WITH (HOLDLOCK)  -- see Locking above
            WHERE
                s.AccountName = @AccountName
                AND s.Address = l.Address
                AND s.AppName IN (N'', ISNULL(@AppName, N''))
                AND (s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > SYSUTCDATETIME())
        ), 1, 0) AS IsSuppressed
    FROM mailq.MailRecipientList(@ToAddress, @CC, @BCC) AS l
) AS r;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailBatchRow: the table type of mailq.EnqueueMailBatch's @MailRows (a TVP).
One row per mail: mailq.EnqueueMail's parameters with the same names and types,
so a row and a single call with the same values are the same mail; RowNo is the
caller's ordinal, named by errors and results; NULL means EnqueueMail's default.
A type in use (mailq.EnqueueMailBatch, mailq.EnqueueMailRows) can be neither
altered nor dropped: a later shape is a new type.  Callers need EXECUTE on it
(sql/security/MailqEnqueuer.batch.grants.sql).
*/
IF TYPE_ID(N'mailq.MailBatchRow') IS NULL
    CREATE TYPE mailq.MailBatchRow AS TABLE (
        RowNo INT NOT NULL PRIMARY KEY,
        ToAddress NVARCHAR(MAX) NULL,
        Subject NVARCHAR(MAX) NULL,
        Body NVARCHAR(MAX) NULL,
        BodyFormat NVARCHAR(20) NULL,
        TextBody NVARCHAR(MAX) NULL,
        CC NVARCHAR(MAX) NULL,
        BCC NVARCHAR(MAX) NULL,
        FromAddress NVARCHAR(MAX) NULL,
        FromName NVARCHAR(MAX) NULL,
        ReplyTo NVARCHAR(MAX) NULL,
        Headers NVARCHAR(MAX) NULL,
        AccountName NVARCHAR(4000) NULL,
        AppName NVARCHAR(4000) NULL,
        Priority INT NULL,
        DateToProcess DATETIME2(3) NULL,
        ExpiresAtUtc DATETIME2(3) NULL,
        MaxAttempts INT NULL,
        IdempotencyKey NVARCHAR(4000) NULL,
        Attachments NVARCHAR(MAX) NULL,
        RunMode NVARCHAR(4000) NULL,
        TemplateName NVARCHAR(4000) NULL,
        TemplateVersion INT NULL,
        TemplateModel NVARCHAR(MAX) NULL
    );
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailAttachmentList: the attachments of one mail from EnqueueMail's
@Attachments text, never raising an error (inline).
Parameters:  @Attachments NVARCHAR(MAX): a JSON array; anything else gives no rows
Returns:     per element: AttachmentNo (from 1), IsObject, FileName, ContentType,
             ContentBase64, Generator, GeneratorArgs (object or array),
             GeneratorArgsText (scalar), Base64Ok (canonical base64: A-Z a-z 0-9
             + /, length a multiple of 4, '=' only as 1-2 final characters), Bytes.
No error:    OPENJSON only meets text IIF proved to be JSON (13609 would fail a
             whole batch); nothing is decoded here (the core decodes Base64Ok text).
Example:     SELECT a.Bytes FROM mailq.MailAttachmentList(N'[{"FileName": "a", "ContentBase64": "YQ=="}]') AS a;
*/
CREATE OR ALTER FUNCTION mailq.MailAttachmentList(@Attachments NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN
SELECT
    CAST(e.[key] AS INT) + 1 AS AttachmentNo,
    IIF(e.[type] = 5, 1, 0) AS IsObject,
    f.FileName,
    f.ContentType,
    f.ContentBase64,
    f.Generator,
    f.GeneratorArgs,
    f.GeneratorArgsText,
    IIF(
        b.Chars % 4 = 0
        AND f.ContentBase64 COLLATE Latin1_General_100_BIN2 NOT LIKE N'%[^A-Za-z0-9+/=]%'
        AND (b.Pad = 0 OR (b.Pad >= b.Chars - 1 AND SUBSTRING(f.ContentBase64, b.Pad, 2) IN (N'=', N'=='))),
        1, 0
    ) AS Base64Ok,
    b.Chars / 4 * 3 - IIF(b.Pad = 0, 0, b.Chars - b.Pad + 1) AS Bytes
FROM OPENJSON(IIF(ISJSON(@Attachments) = 1 AND LEFT(LTRIM(@Attachments), 1) = N'[', @Attachments, NULL)) AS e
-- IIF: a scalar element is not JSON text (OPENJSON would raise 13609).
OUTER APPLY OPENJSON (IIF(e.[type] = 5, e.[value], NULL))
    WITH (
        FileName NVARCHAR(4000) '$.FileName',
        ContentType NVARCHAR(4000) '$.ContentType',
        ContentBase64 NVARCHAR(MAX) '$.ContentBase64',
        Generator NVARCHAR(4000) '$.Generator',
        -- AS JSON: an object or array value (NULL for a scalar)
        GeneratorArgs NVARCHAR(MAX) '$.Arguments' AS JSON,
        GeneratorArgsText NVARCHAR(MAX) '$.Arguments'
    ) AS f
-- DATALENGTH, not LEN: trailing spaces count (and are not base64).
CROSS APPLY (
    VALUES (CAST(DATALENGTH(f.ContentBase64) / 2 AS BIGINT), CAST(CHARINDEX(N'=', f.ContentBase64) AS BIGINT))
) AS b(Chars, Pad);
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailBatchJson: EnqueueMailBatch's @Mails (a JSON array of objects) as rows of
mailq.MailBatchRow's columns, never raising an error (inline).
Parameters:  @Mails NVARCHAR(MAX); NULL or not JSON gives no rows
Returns:     RowNo (position + 1), the fields as MailBatchRow types them, and
             InputField/InputMessage: a field unknown or of the wrong JSON type
             (rule 50223), else NULL.  Fields are read as text and converted with
             TRY_CONVERT; Headers, Attachments, TemplateModel may be JSON or a
             string; times are ISO 8601, an offset converted to UTC.
Example:     SELECT j.RowNo, j.InputMessage FROM mailq.MailBatchJson(N'[{"Priority": "9"}]') AS j;
*/
CREATE OR ALTER FUNCTION mailq.MailBatchJson(@Mails NVARCHAR(MAX))
RETURNS TABLE
AS
RETURN
SELECT
    CAST(e.[key] AS INT) + 1 AS RowNo,
    f.ToAddress, f.Subject, f.Body, f.BodyFormat, f.TextBody, f.CC, f.BCC, f.FromAddress, f.FromName,
    f.ReplyTo, COALESCE(f.HeadersObject, f.HeadersText) AS Headers, f.AccountName, f.AppName,
    TRY_CONVERT(INT, f.Priority) AS Priority,
    CONVERT(DATETIME2(3), SWITCHOFFSET(IIF(YEAR(t.Due) BETWEEN 2 AND 9998, t.Due, NULL), N'+00:00')) AS DateToProcess,
    CONVERT(DATETIME2(3), SWITCHOFFSET(IIF(YEAR(t.Expires) BETWEEN 2 AND 9998, t.Expires, NULL), N'+00:00'))
        AS ExpiresAtUtc,
    TRY_CONVERT(INT, f.MaxAttempts) AS MaxAttempts, f.IdempotencyKey,
    COALESCE(f.AttachmentsArray, f.AttachmentsText) AS Attachments, f.RunMode, f.TemplateName,
    TRY_CONVERT(INT, f.TemplateVersion) AS TemplateVersion,
    COALESCE(f.TemplateModelObject, f.TemplateModelText) AS TemplateModel,
    LEFT(p.Field, 128) AS InputField, p.Message AS InputMessage
FROM OPENJSON(IIF(ISJSON(@Mails) = 1, @Mails, NULL)) AS e
-- IIF: an element that is not an object is not JSON text for OPENJSON (13609).
CROSS APPLY OPENJSON (IIF(e.[type] = 5, e.[value], NULL))
    WITH (
        ToAddress NVARCHAR(MAX) '$.ToAddress', Subject NVARCHAR(MAX) '$.Subject',
        Body NVARCHAR(MAX) '$.Body', BodyFormat NVARCHAR(20) '$.BodyFormat',
        TextBody NVARCHAR(MAX) '$.TextBody', CC NVARCHAR(MAX) '$.CC', BCC NVARCHAR(MAX) '$.BCC',
        FromAddress NVARCHAR(MAX) '$.FromAddress', FromName NVARCHAR(MAX) '$.FromName',
        ReplyTo NVARCHAR(MAX) '$.ReplyTo',
        HeadersObject NVARCHAR(MAX) '$.Headers' AS JSON, HeadersText NVARCHAR(MAX) '$.Headers',
        AccountName NVARCHAR(4000) '$.AccountName', AppName NVARCHAR(4000) '$.AppName',
        Priority NVARCHAR(MAX) '$.Priority', DateToProcess NVARCHAR(MAX) '$.DateToProcess',
        ExpiresAtUtc NVARCHAR(MAX) '$.ExpiresAtUtc', MaxAttempts NVARCHAR(MAX) '$.MaxAttempts',
        IdempotencyKey NVARCHAR(4000) '$.IdempotencyKey',
        AttachmentsArray NVARCHAR(MAX) '$.Attachments' AS JSON, AttachmentsText NVARCHAR(MAX) '$.Attachments',
        RunMode NVARCHAR(4000) '$.RunMode', TemplateName NVARCHAR(4000) '$.TemplateName',
        TemplateVersion NVARCHAR(MAX) '$.TemplateVersion',
        TemplateModelObject NVARCHAR(MAX) '$.TemplateModel' AS JSON,
        TemplateModelText NVARCHAR(MAX) '$.TemplateModel'
    ) AS f
CROSS APPLY (
    VALUES (TRY_CONVERT(DATETIMEOFFSET(3), f.DateToProcess, 127), TRY_CONVERT(DATETIMEOFFSET(3), f.ExpiresAtUtc, 127))
) AS t(Due, Expires)
OUTER APPLY (
    SELECT TOP (1) k.[key] AS Field, v.Message
    FROM OPENJSON(IIF(e.[type] = 5, e.[value], NULL)) AS k
    CROSS APPLY (
        SELECT CASE
            WHEN k.[key] COLLATE Latin1_General_100_BIN2 NOT IN (
                N'ToAddress', N'Subject', N'Body', N'BodyFormat', N'TextBody', N'CC', N'BCC', N'FromAddress',
                N'FromName', N'ReplyTo', N'Headers', N'AccountName', N'AppName', N'Priority', N'DateToProcess',
                N'ExpiresAtUtc', N'MaxAttempts', N'IdempotencyKey', N'Attachments', N'RunMode', N'TemplateName',
                N'TemplateVersion', N'TemplateModel'
            )
                THEN CONCAT(N'''', LEFT(k.[key], 80), N''' is not a field of a mail (names are case-sensitive).')
            WHEN k.[type] = 0 OR k.[key] IN (N'Headers', N'Attachments', N'TemplateModel') THEN NULL
            WHEN k.[key] IN (N'Priority', N'MaxAttempts', N'TemplateVersion')
                THEN IIF(k.[type] = 2 AND TRY_CONVERT(INT, k.[value]) IS NOT NULL, NULL,
                    CONCAT(N'''', k.[key], N''' must be a JSON number that is an integer (not a string).'))
            WHEN k.[key] IN (N'DateToProcess', N'ExpiresAtUtc')
                THEN IIF(k.[type] = 1
                    AND YEAR(TRY_CONVERT(DATETIMEOFFSET(3), k.[value], 127)) BETWEEN 2 AND 9998, NULL,
                    CONCAT(N'''', k.[key], N''' must be an ISO 8601 time, e.g. "2030-01-01T08:00:00Z" ',
                        N'(an offset such as +02:00 is converted to UTC).'))
            WHEN k.[type] <> 1 THEN CONCAT(N'''', k.[key], N''' must be a JSON string.')
        END AS Message
    ) AS v
    WHERE v.Message IS NOT NULL
) AS p;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.EnqueueMailCheck: THE rules of enqueueing one mail (docs/enqueue.md), its
defaults and its idempotency content hash; inline in mailq.EnqueueMailRows, its
one caller, for a single call and every batch row alike.
Parameters:  mailq.MailBatchRow's 23 fields in column order (NULL = default);
             @InputField/@InputMessage (rule 50223); @P N'@' (messages name
             parameters) or N'' (batch fields); @Now; @User; @PrincipalApp;
             @AllowUnmapped; @TemplateLatest, @TemplateRetired (read by the caller).
Returns:     one row: the values to store, defaults applied; KeyText; Domain (of the
             Message-ID); ContentHash (SHA-256 of the normalized content); and the
             FIRST broken rule by RuleOrder: ErrorNumber, Field, Message (NULL if
             valid).  The suppression rule (50600) is EnqueueMailRows'.
Errors:      none raised: JSON functions read only text IIF proved to be JSON.
Example:     see mailq.EnqueueMailRows.
*/
CREATE OR ALTER FUNCTION mailq.EnqueueMailCheck(
    @ToAddress NVARCHAR(MAX), @Subject NVARCHAR(MAX), @Body NVARCHAR(MAX), @BodyFormat NVARCHAR(20),
    @TextBody NVARCHAR(MAX), @CC NVARCHAR(MAX), @BCC NVARCHAR(MAX), @FromAddress NVARCHAR(MAX),
    @FromName NVARCHAR(MAX), @ReplyTo NVARCHAR(MAX), @Headers NVARCHAR(MAX), @AccountName NVARCHAR(4000),
    @AppName NVARCHAR(4000), @Priority INT, @DateToProcess DATETIME2(3), @ExpiresAtUtc DATETIME2(3),
    @MaxAttempts INT, @IdempotencyKey NVARCHAR(4000), @Attachments NVARCHAR(MAX), @RunMode NVARCHAR(4000),
    @TemplateName NVARCHAR(4000), @TemplateVersion INT, @TemplateModel NVARCHAR(MAX),
    @InputField NVARCHAR(128), @InputMessage NVARCHAR(2048), @P NVARCHAR(1), @Now DATETIME2(3),
    @User NVARCHAR(128), @PrincipalApp NVARCHAR(128), @AllowUnmapped BIT, @TemplateLatest INT,
    @TemplateRetired DATETIME2(3)
)
RETURNS TABLE
AS
RETURN
-- n: the defaults, and what the rules look up (one row).
WITH n AS (
    SELECT
        a.AccountName,
        IIF(@TemplateName IS NULL, @Subject, N'') AS Subject,   -- a template renders subject and body
        IIF(@TemplateName IS NULL, @Body, N'') AS Body,
        IIF(@TemplateName IS NULL, COALESCE(@BodyFormat, N'Text'), N'Text') AS BodyFormat,
        LEFT(LTRIM(RTRIM(COALESCE(@FromAddress, a.DefaultFrom))), 320) AS FromAddress,
        LEFT(COALESCE(@FromName, a.DefaultFromName), 200) AS FromName,
        LTRIM(RTRIM(@ReplyTo)) AS ReplyTo,
        LEFT(COALESCE(@PrincipalApp, @AppName), 128) AS AppName,
        COALESCE(@Priority, 5) AS Priority,
        COALESCE(@DateToProcess, @Now) AS DueUtc,
        COALESCE(@MaxAttempts, 5) AS MaxAttempts,
        COALESCE(@RunMode, N'prod') AS RunMode,
        IIF(@TemplateName IS NULL, @TemplateModel, COALESCE(@TemplateModel, N'{}')) AS TemplateModel,
        IIF(ISJSON(@Headers) = 1 AND LEFT(LTRIM(@Headers), 1) = N'{', @Headers, NULL) AS HeadersJson,
        N'%[' + NCHAR(13) + NCHAR(10) + N']%' AS CrLf,
        (SELECT COUNT(*) FROM mailq.ParseAddressList(@ReplyTo)) AS ReplyToCount,
        (SELECT COUNT(*) FROM mailq.ParseAddressList(@FromAddress)) AS FromCount,
        (SELECT COUNT(x.DisplayName) FROM mailq.ParseAddressList(@FromAddress) AS x) AS FromNames,
        (
            SELECT COUNT(*) FROM (VALUES (@ToAddress), (@CC), (@BCC)) AS v(List)
            CROSS APPLY mailq.ParseAddressList(v.List)
        ) AS Recipients
    -- The account named, or the default one; MAX makes one row either way.
    FROM (
        SELECT
            MAX(s.AccountName) AS AccountName, MAX(s.DefaultFromAddress) AS DefaultFrom,
            MAX(s.DefaultFromName) AS DefaultFromName
        FROM mailq.SendingAccount AS s
        WHERE s.AccountName = COALESCE(@AccountName, (
            SELECT x.AccountName FROM mailq.SendingAccount AS x WHERE x.IsDefault = 1
        ))
    ) AS a
),

-- Every broken rule: (RuleOrder, Position, Item) orders them; the first one wins.
problems AS (
    SELECT v.RuleOrder, 0 AS Position, 0 AS Item, v.ErrorNumber, v.Field, v.Message
    FROM n
    CROSS APPLY (VALUES
        (1, 50500, N'AppName', IIF(@PrincipalApp IS NULL AND @AllowUnmapped = 0, 1, 0), CONCAT(
            N'Database user ', QUOTENAME(@User), N' is not mapped to an application, and this installation ',
            N'refuses unmapped enqueuers: an administrator maps it with EXEC mailq.BindApplication ',
            N'@AppName = N''<application>'', @PrincipalName = N''', REPLACE(@User, N'''', N''''''), N''';')),
        (2, 50223, @InputField, IIF(@InputMessage IS NULL, 0, 1), @InputMessage),
        (3, 50101, N'ToAddress', IIF(n.Recipients = 0, 1, 0), CONCAT(@P, N'ToAddress, ', @P, N'CC and ', @P,
            N'BCC name no recipient: give at least one address in any of them (separate several with ;).')),
        (4, 50281, N'TemplateName',
            IIF(@TemplateName IS NULL AND (@TemplateVersion IS NOT NULL OR @TemplateModel IS NOT NULL), 1, 0),
            CONCAT(@P, N'TemplateVersion and ', @P, N'TemplateModel need ', @P, N'TemplateName.')),
        (5, 50280, N'TemplateName', IIF(@TemplateName IS NOT NULL
                AND (@Body IS NOT NULL OR @TextBody IS NOT NULL OR NULLIF(@Subject, N'') IS NOT NULL), 1, 0),
            CONCAT(@P, N'TemplateName renders the subject and the body: leave ', @P, N'Subject, ', @P,
                N'Body and ', @P, N'TextBody NULL.')),
        (6, 50121, N'Subject', IIF(n.Subject IS NULL, 1, 0),
            CONCAT(@P, N'Subject is required (pass N'''' for a mail without subject).')),
        (7, 50120, N'Body', IIF(n.Body IS NULL, 1, 0),
            CONCAT(@P, N'Body is required (or ', @P, N'TemplateName and ', @P, N'TemplateModel).')),
        (11, 50102, N'ReplyTo', IIF(n.ReplyToCount > 1, 1, 0), CONCAT(@P, N'ReplyTo takes one address.')),
        (12, 50102, N'FromAddress', IIF(n.FromCount > 1, 1, 0), CONCAT(@P, N'FromAddress takes one address.')),
        (13, 50102, N'FromAddress', IIF(n.FromNames > 0, 1, 0),
            CONCAT(@P, N'FromAddress takes a bare address; give the display name in ', @P, N'FromName.')),
        (14, 50104, N'ToAddress', IIF(n.Recipients > 100, 1, 0), CONCAT(@P, N'ToAddress, ', @P, N'CC and ', @P,
            N'BCC name ', n.Recipients, N' recipients together; the limit is 100.')),
        (15, 50118, N'BodyFormat', IIF(n.BodyFormat NOT IN (N'Text', N'Html'), 1, 0),
            CONCAT(@P, N'BodyFormat must be Text or Html; got ''', LEFT(n.BodyFormat, 20), N'''.')),
        (16, 50109, N'Priority', IIF(n.Priority NOT BETWEEN 0 AND 9, 1, 0),
            CONCAT(@P, N'Priority must be 0-9 (9 is sent first); got ', n.Priority, N'.')),
        (17, 50119, N'MaxAttempts', IIF(n.MaxAttempts NOT BETWEEN 1 AND 20, 1, 0),
            CONCAT(@P, N'MaxAttempts must be 1-20; got ', n.MaxAttempts, N'.')),
        (18, 50110, N'ExpiresAtUtc', IIF(@ExpiresAtUtc <= n.DueUtc, 1, 0), CONCAT(@P, N'ExpiresAtUtc (',
            CONVERT(NVARCHAR(30), @ExpiresAtUtc, 126), N') must be later than the due time (',
            CONVERT(NVARCHAR(30), n.DueUtc, 126), N').')),
        (19, 50111, N'Body', IIF(LEN(@Body) > 2000000 OR LEN(@TextBody) > 2000000, 1, 0),
            CONCAT(@P, N'Body and ', @P, N'TextBody are limited to 2,000,000 characters each.')),
        -- The rule of CK_MailQueue_RunMode, compared as binary (a-z means a-z only).
        (20, 50240, N'RunMode', IIF(LEN(n.RunMode) NOT BETWEEN 1 AND 32
                OR n.RunMode COLLATE Latin1_General_100_BIN2 NOT LIKE N'[a-z]%'
                OR n.RunMode COLLATE Latin1_General_100_BIN2 LIKE N'%[^a-z0-9_-]%', 1, 0),
            CONCAT(@P, N'RunMode must be a run-mode name of 1-32 characters, a-z first, then a-z 0-9 - _ ',
                N'(e.g. prod, staging, test); got ''', LEFT(n.RunMode, 40), N'''.')),
        (21, 50285, N'TemplateName', IIF(@TemplateName IS NOT NULL AND (LEN(@TemplateName) NOT BETWEEN 1 AND 128
                OR @TemplateName COLLATE Latin1_General_100_BIN2 LIKE N'%[^A-Za-z0-9._-]%'
                OR @TemplateVersion < 1), 1, 0),
            CONCAT(@P, N'TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ - and ', @P,
                N'TemplateVersion >= 1; got ''', LEFT(@TemplateName, 130), N''' version ',
                COALESCE(CONVERT(NVARCHAR(12), @TemplateVersion), N'NULL'), N'.')),
        (22, 50284, N'TemplateModel', IIF(@TemplateName IS NOT NULL AND (LEN(n.TemplateModel) > 2000000
                OR ISJSON(n.TemplateModel) = 0 OR LEFT(LTRIM(n.TemplateModel), 1) <> N'{'), 1, 0),
            CONCAT(@P, N'TemplateModel must be a JSON object (its keys are the variables), <= 2,000,000 characters.')),
        (23, 50282, N'TemplateName', IIF(@TemplateName IS NOT NULL
                AND (@TemplateLatest IS NULL OR @TemplateVersion > @TemplateLatest), 1, 0),
            CONCAT(@P, N'TemplateName ''', LEFT(@TemplateName, 130), N'''',
                IIF(@TemplateLatest IS NULL, N' is not a template (mailq.AddMailTemplateVersion).',
                    CONCAT(N' has no version ', @TemplateVersion, N' (latest: ', @TemplateLatest, N').')))),
        (24, 50283, N'TemplateName', IIF(@TemplateRetired IS NOT NULL AND @TemplateName IS NOT NULL, 1, 0),
            CONCAT(@P, N'TemplateName ''', LEFT(@TemplateName, 130),
                N''' is retired (mailq.RetireMailTemplate @Retire = 0 brings it back).')),
        (25, 50106, N'Headers', IIF(@Headers IS NOT NULL AND n.HeadersJson IS NULL, 1, 0),
            CONCAT(@P, N'Headers must be a JSON object of string values, e.g. {"X-Order-Id": "42"}.')),
        (27, 50168, N'AppName', IIF(@AppName <> @PrincipalApp, 1, 0), CONCAT(N'Database user ', QUOTENAME(@User),
            N' enqueues as application ''', @PrincipalApp, N''' only; got ', @P, N'AppName ''', LEFT(@AppName, 128),
            N'''.')),
        (28, 50114, N'AccountName', IIF(n.AccountName IS NULL, 1, 0), IIF(@AccountName IS NULL,
            CONCAT(@P, N'AccountName is NULL and no default sending account exists ',
                N'(mailq.UpsertSendingAccount @AccountName = ..., @IsDefault = 1).'),
            CONCAT(@P, N'AccountName ''', LEFT(@AccountName, 128),
                N''' is not a sending account (mailq.UpsertSendingAccount).'))),
        (29, 50115, N'AppName', IIF(n.AppName IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = n.AppName), 1, 0),
            CONCAT(@P, N'AppName ''', n.AppName, N''' is not a registered application (mailq.UpsertApplication).')),
        (30, 50160, N'AccountName', IIF(n.AppName IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM mailq.ApplicationAccount AS b
                WHERE b.AppName = n.AppName AND b.AccountName = n.AccountName
            ), 1, 0), CONCAT(N'Application ''', n.AppName, N''' may not send through account ''', n.AccountName,
                N''' (an administrator binds it: mailq.BindApplication @AppName, @AccountName).')),
        -- Addresses and domains compare case-insensitively whatever the collation (LOWER, then binary).
        (31, 50161, N'FromAddress', IIF(n.AppName IS NOT NULL AND NOT EXISTS (
                SELECT 1
                FROM mailq.ApplicationFrom AS f
                CROSS APPLY (VALUES (LOWER(n.FromAddress) COLLATE Latin1_General_100_BIN2)) AS l(Addr)
                WHERE f.AppName = n.AppName AND (f.FromPattern = l.Addr
                    OR (LEFT(f.FromPattern, 1) = N'@' AND RIGHT(l.Addr, LEN(f.FromPattern)) = f.FromPattern))
            ), 1, 0), CONCAT(N'Application ''', n.AppName, N''' may not send as ''', n.FromAddress,
                N''' (an administrator binds it: mailq.BindApplication @AppName, @FromAddress = N''addr'' or ',
                N'N''@domain'').')),
        (32, 50117, N'Attachments', IIF(ISJSON(@Attachments) = 0 OR LEFT(LTRIM(@Attachments), 1) <> N'[', 1, 0),
            CONCAT(@P, N'Attachments must be a JSON array of {"FileName", "ContentType", "ContentBase64"} objects.'))
    ) AS v(RuleOrder, ErrorNumber, Field, Failed, Message)
    WHERE v.Failed = 1
    UNION ALL
    -- 8: a value over its size, 9: CR/LF in a header value; the first field by position.
    SELECT v.RuleOrder, v.Position, 0, v.ErrorNumber, v.Field,
        CONCAT(@P, v.Field, IIF(v.RuleOrder = 8,
            CONCAT(N' is ', LEN(v.Value), N' characters long; the limit is ', v.MaxLength, N'.'),
            N' contains CR or LF; header values must be one line (header injection is refused).'))
    FROM n
    CROSS APPLY (VALUES
        (8, 50103, 1, N'ToAddress', @ToAddress, 4000), (8, 50103, 2, N'CC', @CC, 4000),
        (8, 50103, 3, N'BCC', @BCC, 4000), (8, 50103, 4, N'Subject', @Subject, 900),
        (8, 50103, 5, N'FromAddress', @FromAddress, 320), (8, 50103, 6, N'FromName', @FromName, 200),
        (8, 50103, 7, N'ReplyTo', @ReplyTo, 320), (8, 50103, 8, N'AccountName', @AccountName, 128),
        (8, 50103, 9, N'AppName', @AppName, 128), (8, 50103, 10, N'IdempotencyKey', @IdempotencyKey, 200),
        (9, 50105, 1, N'Subject', @Subject, 0), (9, 50105, 2, N'FromName', @FromName, 0),
        (9, 50105, 3, N'ReplyTo', @ReplyTo, 0), (9, 50105, 4, N'FromAddress', @FromAddress, 0),
        (9, 50105, 5, N'IdempotencyKey', @IdempotencyKey, 0)
    ) AS v(RuleOrder, ErrorNumber, Position, Field, Value, MaxLength)
    WHERE IIF(v.RuleOrder = 8, IIF(LEN(v.Value) > v.MaxLength, 1, 0),
        IIF(v.Value COLLATE Latin1_General_100_BIN2 LIKE n.CrLf, 1, 0)) = 1
    UNION ALL
    -- 10: an address that is not one.
    SELECT 10, v.Position, 0, 50102, v.Field,
        CONCAT(@P, v.Field, N': address ''', LEFT(x.Address, 100), N''' ', x.Problem, N'.')
    FROM (VALUES
        (1, N'ToAddress', @ToAddress), (2, N'CC', @CC), (3, N'BCC', @BCC), (4, N'ReplyTo', @ReplyTo),
        (5, N'FromAddress', @FromAddress)
    ) AS v(Position, Field, Value)
    CROSS APPLY mailq.ParseAddressList(v.Value) AS x
    WHERE x.Problem IS NOT NULL
    UNION ALL
    -- 26: business headers (HeadersJson is NULL unless @Headers is a JSON object).
    SELECT 26, x.Position, 0, x.ErrorNumber, N'Headers', x.Message
    FROM (
        SELECT
            j.[key] AS Name, j.[value] AS Value, j.[type] AS JsonType,
            COUNT(*) OVER () AS Headers, COUNT(*) OVER (PARTITION BY UPPER(j.[key])) AS SameName, n.CrLf
        FROM n
        CROSS APPLY OPENJSON(n.HeadersJson) AS j
    ) AS h
    CROSS APPLY (VALUES
        (1, 50106, IIF(h.JsonType <> 1, 1, 0),
            CONCAT(@P, N'Headers: the value of ''', LEFT(h.Name, 80), N''' must be a JSON string.')),
        (2, 50106, IIF(h.Headers > 50, 1, 0), CONCAT(@P, N'Headers holds more than 50 headers.')),
        (3, 50106, IIF(h.SameName > 1, 1, 0), CONCAT(@P, N'Headers names one header twice.')),
        -- RFC 5322 field name: 1-76 printable US-ASCII characters except ':'.
        (4, 50107, IIF(LEN(h.Name) NOT BETWEEN 1 AND 76
                OR h.Name COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-9;-~]%', 1, 0),
            CONCAT(@P, N'Headers: ''', LEFT(h.Name, 80), N''' is not a valid header name ',
                N'(1-76 printable ASCII characters, no space or colon).')),
        (5, 50108, IIF(UPPER(h.Name) IN (
                N'FROM', N'TO', N'CC', N'BCC', N'SUBJECT', N'MESSAGE-ID', N'DATE', N'REPLY-TO', N'SENDER',
                N'RETURN-PATH', N'MIME-VERSION', N'CONTENT-TYPE', N'CONTENT-TRANSFER-ENCODING',
                N'CONTENT-DISPOSITION'
            ), 1, 0),
            CONCAT(@P, N'Headers: ''', LEFT(h.Name, 80), N''' is set by mailq-db and cannot be overridden.')),
        (6, 50105, IIF(h.Value COLLATE Latin1_General_100_BIN2 LIKE h.CrLf, 1, 0), CONCAT(@P,
            N'Headers: the value of ''', LEFT(h.Name, 80), N''' contains CR or LF (header injection is refused).')),
        (7, 50103, IIF(LEN(h.Value) > 900, 1, 0),
            CONCAT(@P, N'Headers: the value of ''', LEFT(h.Name, 80), N''' is longer than 900 characters.'))
    ) AS x(Position, ErrorNumber, Failed, Message)
    WHERE x.Failed = 1
    UNION ALL
    -- 33: attachments (mailq.MailAttachmentList reads a JSON array only and decodes nothing).
    SELECT 33, x.Position, t.AttachmentNo, x.ErrorNumber, N'Attachments', x.Message
    FROM (
        SELECT
            a.AttachmentNo, a.IsObject, a.FileName, a.ContentType, a.ContentBase64, a.Generator, a.GeneratorArgs,
            a.GeneratorArgsText, a.Base64Ok, a.Bytes, COUNT(*) OVER () AS Files, SUM(a.Bytes) OVER () AS TotalBytes
        FROM mailq.MailAttachmentList(@Attachments) AS a
    ) AS t
    CROSS APPLY (VALUES
        (1, 50117, IIF(t.IsObject = 0 OR (t.ContentBase64 IS NULL AND t.Generator IS NULL), 1, 0),
            CONCAT(@P, N'Attachments: every element must be an object with FileName and ContentBase64.')),
        (2, 50117, IIF(t.ContentBase64 IS NOT NULL AND t.Base64Ok = 0, 1, 0),
            CONCAT(@P, N'Attachments: ContentBase64 of attachment ', t.AttachmentNo,
                N' must be base64 text (A-Z, a-z, 0-9, +, /, ''='' padding, no line breaks).')),
        (3, 50286, IIF(t.Generator IS NOT NULL AND (t.ContentBase64 IS NOT NULL OR t.GeneratorArgsText IS NOT NULL
                OR LEFT(LTRIM(t.GeneratorArgs), 1) <> N'{' OR LEN(t.Generator) NOT BETWEEN 1 AND 128
                OR t.Generator COLLATE Latin1_General_100_BIN2 LIKE N'%[^A-Za-z0-9._-]%'), 1, 0),
            CONCAT(@P, N'Attachments: attachment ', t.AttachmentNo, N' (''', LEFT(t.FileName, 100), N'''): ', CASE
                WHEN t.ContentBase64 IS NOT NULL THEN N'give ContentBase64 or Generator, not both.'
                WHEN t.GeneratorArgsText IS NOT NULL OR LEFT(LTRIM(t.GeneratorArgs), 1) <> N'{'
                    THEN N'Arguments must be a JSON object.'
                ELSE N'Generator must be 1-128 characters of A-Z a-z 0-9 . _ - (an entry point name).'
            END)),
        (4, 50112, IIF(t.Files > 10, 1, 0), CONCAT(@P, N'Attachments holds more than 10 attachments.')),
        (5, 50113, IIF(NULLIF(LTRIM(RTRIM(t.FileName)), N'') IS NULL OR t.FileName LIKE N'%[/\:]%'
                OR t.FileName IN (N'.', N'..') OR LEN(t.FileName) > 255
                OR t.FileName COLLATE Latin1_General_100_BIN2
                LIKE N'%[' + NCHAR(0) + N'-' + NCHAR(31) + NCHAR(127) + N']%', 1, 0),
            CONCAT(@P, N'Attachments: file name ''', LEFT(t.FileName, 100),
                N''' must be a bare file name (not empty, no path, no control characters, <= 255 characters).')),
        (6, 50117, IIF(t.ContentType NOT LIKE N'_%/_%' OR LEN(t.ContentType) > 255
                OR t.ContentType COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(13) + NCHAR(10) + N']%', 1, 0),
            CONCAT(@P, N'Attachments: content type of ''', LEFT(t.FileName, 100), N''' must look like type/subtype.')),
        (7, 50112, IIF(t.Bytes > 10485760, 1, 0), CONCAT(@P, N'Attachments: ''', LEFT(t.FileName, 100),
            N''' is ', t.Bytes, N' bytes; the limit is 10485760 (10 MiB) per attachment.')),
        (8, 50112, IIF(t.TotalBytes > 26214400, 1, 0),
            CONCAT(@P, N'Attachments total more than 26214400 bytes (25 MiB) per mail.'))
    ) AS x(Position, ErrorNumber, Failed, Message)
    WHERE x.Failed = 1
),

firstproblem AS (
    SELECT TOP (1) p.ErrorNumber, p.Field, p.Message FROM problems AS p ORDER BY p.RuleOrder, p.Position, p.Item
)

SELECT
    n.Subject, n.Body, n.BodyFormat, n.FromAddress, n.FromName, n.ReplyTo, n.AccountName, n.AppName,
    n.Priority, n.DueUtc, n.MaxAttempts, n.RunMode, n.TemplateModel,
    RTRIM(@IdempotencyKey) COLLATE Latin1_General_100_BIN2 AS KeyText,
    -- A Message-ID is ASCII and fits its column: another domain gets a neutral one.
    IIF(d.Domain COLLATE Latin1_General_100_BIN2 LIKE N'%[^!-~]%' OR LEN(d.Domain) > 200, N'mailq-db.invalid', d.Domain)
        AS Domain,
    -- Normalized: neither a default's spelling nor the path (single, JSON, TVP) changes it.
    HASHBYTES('SHA2_256', (
        SELECT
            @ToAddress AS ToAddress, @CC AS CC, @BCC AS BCC, n.Subject, n.Body, n.BodyFormat,
            @TextBody AS TextBody, n.FromAddress, n.FromName, n.ReplyTo, n.AccountName, n.AppName, n.Priority,
            @DateToProcess AS DateToProcess, @ExpiresAtUtc AS ExpiresAtUtc, n.MaxAttempts, n.RunMode,
            @TemplateName AS TemplateName, @TemplateVersion AS TemplateVersion, n.TemplateModel,
            (
                SELECT j.[key] AS Name, j.[value] AS Value FROM OPENJSON(n.HeadersJson) AS j
                ORDER BY j.[key] FOR JSON PATH
            ) AS Headers,
            (
                SELECT
                    LTRIM(RTRIM(t.FileName)) AS FileName,
                    COALESCE(t.ContentType, N'application/octet-stream') AS ContentType,
                    t.ContentBase64, t.Generator, t.GeneratorArgs
                FROM mailq.MailAttachmentList(@Attachments) AS t
                ORDER BY t.AttachmentNo FOR JSON PATH
            ) AS Attachments
        FOR JSON PATH, WITHOUT_ARRAY_WRAPPER, INCLUDE_NULL_VALUES
    )) AS ContentHash,
    r.ErrorNumber, r.Field, r.Message
FROM n
CROSS APPLY (VALUES (SUBSTRING(n.FromAddress, CHARINDEX(N'@', n.FromAddress) + 1, 320))) AS d(Domain)
LEFT JOIN firstproblem AS r ON 1 = 1;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.QueueCountsByStatus: how many mails each account has in each status.
Plan: an ordered scan of IX_MailQueue_Status + aggregate, never PK_MailQueue
(tests/integration/test_mailq_view_plans.py).
*/
CREATE OR ALTER VIEW mailq.QueueCountsByStatus
AS
SELECT
    q.Status,
    q.AccountName,
    COUNT_BIG(*) AS MailCount
FROM mailq.MailQueue AS q
GROUP BY q.Status, q.AccountName;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.OldestDueMail: per account, the oldest due UnSent mail, its age in seconds
and how many are due; a growing age means the workers fall behind or the account
is blocked.  Plan: a seek on IX_MailQueue_Status (or the covering claim index),
never PK_MailQueue (tests/integration/test_mailq_view_plans.py).
*/
CREATE OR ALTER VIEW mailq.OldestDueMail
AS
SELECT
    q.AccountName,
    MIN(q.VisibleAtUtc) AS OldestDueUtc,
    DATEDIFF_BIG(SECOND, MIN(q.VisibleAtUtc), SYSUTCDATETIME()) AS OldestDueAgeSeconds,
    COUNT_BIG(*) AS DueCount
FROM mailq.MailQueue AS q
WHERE q.Status = N'UnSent' AND q.VisibleAtUtc <= SYSUTCDATETIME()
GROUP BY q.AccountName;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ThroughputPerHour: attempts finished per UTC hour and account over the last
48 hours: Sent (Sent, DryRun) and Failed (Retry, Wait, Stop, Abandoned).
Plan: a range seek on IX_MailAttempt_EndedAtUtc, PK_MailQueue by ID; never a scan
of either table's clustered rows (tests/integration/test_mailq_view_plans.py).
*/
CREATE OR ALTER VIEW mailq.ThroughputPerHour
AS
WITH RecentAttempt AS (
    SELECT
        t.MailID,
        t.Outcome,
        DATEADD(HOUR, DATEDIFF(HOUR, '20000101', t.EndedAtUtc), CAST('20000101' AS DATETIME2(0))) AS HourUtc
    FROM mailq.MailAttempt AS t
    WHERE t.EndedAtUtc >= DATEADD(HOUR, -48, SYSUTCDATETIME())
)

SELECT
    r.HourUtc,
    q.AccountName,
    SUM(IIF(r.Outcome IN (N'Sent', N'DryRun'), 1, 0)) AS Sent,
    SUM(IIF(r.Outcome IN (N'Retry', N'Wait', N'Stop', N'Abandoned'), 1, 0)) AS Failed
FROM RecentAttempt AS r
INNER JOIN mailq.MailQueue AS q ON r.MailID = q.ID
GROUP BY r.HourUtc, q.AccountName;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RecentFailures: failed attempts of the last 7 days (Retry, Wait, Stop,
Abandoned) with the mail's current status: did it get through later?
Plan: a range seek on IX_MailAttempt_EndedAtUtc, PK_MailQueue by ID; never a scan
of either table's clustered rows (tests/integration/test_mailq_view_plans.py).
*/
CREATE OR ALTER VIEW mailq.RecentFailures
AS
SELECT
    t.MailID AS ID,
    t.AttemptNo,
    q.AccountName,
    q.Status,
    t.Outcome,
    t.SmtpCode,
    t.ErrorText AS LastError,
    t.EndedAtUtc AS DateProcessed
FROM mailq.MailAttempt AS t
INNER JOIN mailq.MailQueue AS q ON t.MailID = q.ID
WHERE
    t.EndedAtUtc >= DATEADD(DAY, -7, SYSUTCDATETIME())
    AND t.Outcome IN (N'Retry', N'Wait', N'Stop', N'Abandoned');
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RecipientOutcomes: per-recipient results of mails accepted for some
recipients only, with the mail's account and status: Refused (5xx, final),
Deferred (4xx, retried with the mail), Delivered.
*/
CREATE OR ALTER VIEW mailq.RecipientOutcomes
AS
SELECT
    o.MailID AS ID,
    q.AccountName,
    q.Status,
    o.Address,
    o.Outcome,
    o.SmtpCode,
    o.SmtpText,
    o.AttemptNo,
    o.UpdatedAtUtc
FROM mailq.MailRecipientOutcome AS o
INNER JOIN mailq.MailQueue AS q ON o.MailID = q.ID;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.LockLeasedMail: the fence of every acknowledgement (internal: ExtendLease,
ReleaseMail, MarkSent and MarkFailed call it in their transaction).  Locks the mails
WITH (UPDLOCK, ROWLOCK) until the caller's transaction ends and raises unless each
exists, is Sending and holds @LockToken: a reclaimed worker changes nothing.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array of 1-1000): exactly one;
             @LockToken UNIQUEIDENTIFIER, required; @AcceptSentByToken BIT = 0: 1
             also accepts a mail already Sent under @LockToken (a repeated MarkSent);
             @AcceptFailedByToken BIT = 0: 1 also accepts a repeated MarkFailed (the attempt
             under @LockToken ended Retry, Wait or Stop; reclaimed since or not; not Stopped)
Result set:  none.
Errors:      50131 @LockToken missing; 50136 neither or both of @ID/@IDList;
             50137 @IDList malformed; 50138 no open transaction; 50201 unknown
             mail; 50202 leased under another token; 50203 not Sending.
Transaction: the caller's only; an error dooms it (XACT_ABORT ON) and is re-raised.
Isolation:   READ COMMITTED, set here; the MailAttempt read is READCOMMITTEDLOCK.
Lock order:  mailq.MailQueue rows in the plan's order (overlapping lists under two
             tokens can deadlock, 1205), then mailq.MailAttempt.
Example:     EXEC mailq.LockLeasedMail @IDList = N'[1,2]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.LockLeasedMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @AcceptSentByToken BIT = 0,
    @AcceptFailedByToken BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @@TRANCOUNT = 0
        THROW 50138, N'mailq.LockLeasedMail must run inside the caller''s transaction.', 1;
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: the token the mails were claimed with.', 1;
    IF (@ID IS NULL AND @IDList IS NULL) OR (@ID IS NOT NULL AND @IDList IS NOT NULL)
        THROW 50136, N'Give exactly one of @ID (one mail) or @IDList (a JSON array of mail IDs).', 1;
    -- Separate statements: OR has no guaranteed order, so OPENJSON could meet
    -- non-JSON and raise 13609 instead of 50137.
    DECLARE @IDListOk BIT = 1;
    IF @IDList IS NOT NULL
    BEGIN
        IF ISJSON(@IDList) = 0 OR LEFT(LTRIM(@IDList), 1) <> N'['
            SET @IDListOk = 0;
        ELSE IF EXISTS (
            SELECT 1
            FROM OPENJSON(@IDList) AS j
            WHERE j.[type] <> 2 OR TRY_CAST(j.[value] AS BIGINT) IS NULL
        )
            SET @IDListOk = 0;
        ELSE IF (SELECT COUNT(*) FROM OPENJSON(@IDList)) NOT BETWEEN 1 AND 1000
            SET @IDListOk = 0;
    END;
    IF @IDListOk = 0
        THROW 50137, N'@IDList must be a JSON array of 1-1000 integer mail IDs, e.g. [101, 102].', 1;
    DECLARE @Held TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        Status NVARCHAR(16) NULL,
        ThreadLock UNIQUEIDENTIFIER NULL
    );
    -- UPDLOCK, ROWLOCK: the fence holds until the caller commits.  No READPAST:
    -- these rows must be seen.  FORCESEEK: OPENJSON's 50-row estimate may pick a
    -- scan, which would keep a U lock on every row read (deadlocks).
    INSERT INTO @Held (ID, Status, ThreadLock)
    SELECT l.ID, q.Status, q.ThreadLock
    FROM mailq.ParseIDList(@ID, @IDList) AS l
    LEFT JOIN mailq.MailQueue AS q WITH (FORCESEEK, UPDLOCK, ROWLOCK) ON l.ID = q.ID;
    SELECT TOP (1) @Msg = CONCAT(N'Mail ', h.ID, N' does not exist.')
    FROM @Held AS h
    WHERE h.Status IS NULL
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50201, @Msg, 1;
    -- A repeated MarkFailed passes (its caller changes only mails still Sending under the token):
    -- its attempt ended Retry/Wait/Stop (committed row); not a mail StopMail ended: 50203.
    IF @AcceptFailedByToken = 1
        DELETE h
        FROM @Held AS h
        WHERE
            (h.Status NOT IN (N'Sending', N'Stopped') OR h.ThreadLock <> @LockToken)
            AND EXISTS (
                SELECT 1
                FROM mailq.MailAttempt AS t WITH (READCOMMITTEDLOCK)
                WHERE t.MailID = h.ID AND t.LockToken = @LockToken AND t.Outcome IN (N'Retry', N'Wait', N'Stop')
            );
    SELECT TOP (1) @Msg = CONCAT(
        N'Mail ', h.ID, N' is ', h.Status, N', not Sending: it was already acknowledged, released or never claimed.'
    )
    FROM @Held AS h
    WHERE
        h.Status <> N'Sending'
        AND NOT (
            @AcceptSentByToken = 1
            AND h.Status = N'Sent'
            AND EXISTS (
                SELECT 1
                -- READCOMMITTEDLOCK: the committed row, never a version.
                FROM mailq.MailAttempt AS t WITH (READCOMMITTEDLOCK)
                WHERE t.MailID = h.ID AND t.LockToken = @LockToken AND t.Outcome IN (N'Sent', N'DryRun')
            )
        )
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50203, @Msg, 1;
    SELECT TOP (1) @Msg = CONCAT(
        N'Mail ', h.ID, N' is leased under another @LockToken: this worker''s lease expired and the mail ',
        N'was reclaimed; nothing was changed.'
    )
    FROM @Held AS h
    WHERE h.ThreadLock <> @LockToken
    ORDER BY h.ID;
    IF @Msg IS NOT NULL THROW 50202, @Msg, 1;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.EnqueueMailRows: the one enqueue implementation (EnqueueMail, EnqueueMailBatch); internal, no grant.
Parameters:  @Rows mailq.MailBatchRow READONLY, @Mails (JSON), or @Single = 1 and one mail in
             @ToAddress ... @TemplateModel; @RejectInvalid BIT (batch): 1 queue the valid rows.
Results:     @Single = 1: the OUTPUTs, no result set; else EnqueueMailBatch's two result sets.
Errors:      @Single = 1: mailq.EnqueueMailCheck's number, 50600, 50162 (key lock); else 50220,
             50225 (key lock), 50224 (base64); all raised before any write.
Transaction: its own if none is open, else the caller's (also distributed); an error dooms it.
Isolation:   READ COMMITTED and the SET options of filtered-index DML, set here.
Lock order:  the keys' application locks (binary key order), mailq.Suppression (shared key ranges,
             held), mailq.MailQueue, mailq.MailAttachment, mailq.MailEvent.
Example:     EXEC mailq.EnqueueMailRows @Rows = @R, @RejectInvalid = 1;
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMailRows
    @Rows mailq.MailBatchRow READONLY,
    @Mails NVARCHAR(MAX) = NULL,
    @RejectInvalid BIT = 0,
    @Single BIT = 0,
    @ToAddress NVARCHAR(MAX) = NULL, @Subject NVARCHAR(MAX) = NULL, @Body NVARCHAR(MAX) = NULL,
    @BodyFormat NVARCHAR(20) = NULL, @TextBody NVARCHAR(MAX) = NULL, @CC NVARCHAR(MAX) = NULL,
    @BCC NVARCHAR(MAX) = NULL, @FromAddress NVARCHAR(MAX) = NULL, @FromName NVARCHAR(MAX) = NULL,
    @ReplyTo NVARCHAR(MAX) = NULL, @Headers NVARCHAR(MAX) = NULL, @AccountName NVARCHAR(4000) = NULL,
    @AppName NVARCHAR(4000) = NULL, @Priority INT = NULL, @DateToProcess DATETIME2(3) = NULL,
    @ExpiresAtUtc DATETIME2(3) = NULL, @MaxAttempts INT = NULL, @IdempotencyKey NVARCHAR(4000) = NULL,
    @Attachments NVARCHAR(MAX) = NULL, @RunMode NVARCHAR(4000) = NULL, @TemplateName NVARCHAR(4000) = NULL,
    @TemplateVersion INT = NULL, @TemplateModel NVARCHAR(MAX) = NULL,
    @MailID BIGINT = NULL OUTPUT,
    @MessageID NVARCHAR(255) = NULL OUTPUT,
    @Created BIT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- Filtered-index DML needs these at run time (else 1934); ARITHABORT follows ANSI_WARNINGS.
    SET ANSI_WARNINGS, ANSI_PADDING, CONCAT_NULL_YIELDS_NULL ON;
    SET NUMERIC_ROUNDABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @P NVARCHAR(1) = IIF(@Single = 1, N'@', N''), @Err INT, @Msg NVARCHAR(2048);
    DECLARE @User NVARCHAR(128) = USER_NAME();   -- the caller; MailqRunner in hooks and delayed targets
    DECLARE @PrincipalApp NVARCHAR(128) = (
        SELECT u.AppName FROM mailq.ApplicationPrincipal AS u WHERE u.PrincipalName = USER_NAME()
    );
    DECLARE @AllowUnmapped BIT = COALESCE(
        (SELECT p.AllowUnmappedEnqueuers FROM mailq.EnqueuePolicy AS p WHERE p.PolicyId = 1), 0
    );
    SET @RejectInvalid = IIF(@Single = 1, 0, COALESCE(@RejectInvalid, 0));
    DECLARE @Work TABLE (   -- NULL spelled out: the session's ANSI_NULL_DFLT_ON does not decide it
        RowNo INT NOT NULL PRIMARY KEY, ToAddress NVARCHAR(MAX) NULL, CC NVARCHAR(MAX) NULL, BCC NVARCHAR(MAX) NULL,
        Subject NVARCHAR(MAX) NULL, Body NVARCHAR(MAX) NULL, BodyFormat NVARCHAR(20) NULL, TextBody NVARCHAR(MAX) NULL,
        Headers NVARCHAR(MAX) NULL, FromAddress NVARCHAR(320) NULL, FromName NVARCHAR(200) NULL,
        ReplyTo NVARCHAR(MAX) NULL, AccountName NVARCHAR(128) NULL, AppName NVARCHAR(128) NULL, Priority INT NULL,
        DueUtc DATETIME2(3) NULL, ExpiresAtUtc DATETIME2(3) NULL, MaxAttempts INT NULL,
        IdempotencyKey NVARCHAR(4000) COLLATE Latin1_General_100_BIN2 NULL,
        KeyText NVARCHAR(4000) COLLATE Latin1_General_100_BIN2 NULL, Attachments NVARCHAR(MAX) NULL,
        RunMode NVARCHAR(4000) NULL, TemplateName NVARCHAR(4000) NULL, TemplateVersion INT NULL,
        TemplateModel NVARCHAR(MAX) NULL, ContentHash VARBINARY(32) NULL, MessageID NVARCHAR(255) NULL,
        ErrorNumber INT NULL, Field NVARCHAR(128) NULL, Message NVARCHAR(2048) NULL, KeyLeader INT NULL,
        KeySeq INT NULL INDEX IX_Work_KeySeq, MailID BIGINT NULL, Created BIT NULL, Suppressed NVARCHAR(MAX) NULL
    );
    DECLARE @Inserted TABLE (MailID BIGINT NOT NULL PRIMARY KEY, MessageID NVARCHAR(255) NOT NULL UNIQUE,
        AppName NVARCHAR(128) NULL);
    INSERT INTO @Work (
        RowNo, ToAddress, CC, BCC, Subject, Body, BodyFormat, TextBody, Headers, FromAddress, FromName, ReplyTo,
        AccountName, AppName, Priority, DueUtc, ExpiresAtUtc, MaxAttempts, IdempotencyKey, KeyText, Attachments,
        RunMode, TemplateName, TemplateVersion, TemplateModel, ContentHash, MessageID, ErrorNumber, Field, Message
    )
    SELECT
        i.RowNo, i.ToAddress, i.CC, i.BCC, c.Subject, c.Body, c.BodyFormat, i.TextBody, i.Headers, c.FromAddress,
        c.FromName, c.ReplyTo, c.AccountName, c.AppName, c.Priority, c.DueUtc, i.ExpiresAtUtc, c.MaxAttempts,
        i.IdempotencyKey, c.KeyText, i.Attachments, c.RunMode, i.TemplateName, i.TemplateVersion, c.TemplateModel,
        c.ContentHash, CONCAT(N'<', LOWER(CONVERT(NCHAR(36), NEWID())), N'@', c.Domain, N'>'),
        c.ErrorNumber, c.Field, LEFT(c.Message, 2048)
    FROM (
        SELECT
            r.RowNo, r.ToAddress, r.Subject, r.Body, r.BodyFormat, r.TextBody, r.CC, r.BCC, r.FromAddress,
            r.FromName, r.ReplyTo, r.Headers, r.AccountName, r.AppName, r.Priority, r.DateToProcess,
            r.ExpiresAtUtc, r.MaxAttempts, r.IdempotencyKey, r.Attachments, r.RunMode, r.TemplateName,
            r.TemplateVersion, r.TemplateModel, CAST(NULL AS NVARCHAR(128)) AS InputField,
            CAST(NULL AS NVARCHAR(2048)) AS InputMessage
        FROM @Rows AS r
        UNION ALL
        SELECT
            1, @ToAddress, @Subject, @Body, @BodyFormat, @TextBody, @CC, @BCC, @FromAddress, @FromName, @ReplyTo,
            @Headers, @AccountName, @AppName, @Priority, @DateToProcess, @ExpiresAtUtc, @MaxAttempts,
            @IdempotencyKey, @Attachments, @RunMode, @TemplateName, @TemplateVersion, @TemplateModel, NULL, NULL
        WHERE @Single = 1
        UNION ALL
        SELECT
            j.RowNo, j.ToAddress, j.Subject, j.Body, j.BodyFormat, j.TextBody, j.CC, j.BCC, j.FromAddress,
            j.FromName, j.ReplyTo, j.Headers, j.AccountName, j.AppName, j.Priority, j.DateToProcess,
            j.ExpiresAtUtc, j.MaxAttempts, j.IdempotencyKey, j.Attachments, j.RunMode, j.TemplateName,
            j.TemplateVersion, j.TemplateModel, j.InputField, j.InputMessage
        FROM mailq.MailBatchJson(@Mails) AS j
    ) AS i
    OUTER APPLY (
        SELECT t.LatestVersion, t.RetiredAtUtc
        FROM mailq.MailTemplate AS t WHERE t.TemplateName = LEFT(i.TemplateName, 128)
    ) AS m
    CROSS APPLY mailq.EnqueueMailCheck(
        i.ToAddress, i.Subject, i.Body, i.BodyFormat, i.TextBody, i.CC, i.BCC, i.FromAddress, i.FromName,
        i.ReplyTo, i.Headers, i.AccountName, i.AppName, i.Priority, i.DateToProcess, i.ExpiresAtUtc,
        i.MaxAttempts, i.IdempotencyKey, i.Attachments, i.RunMode, i.TemplateName, i.TemplateVersion,
        i.TemplateModel, i.InputField, i.InputMessage, @P, @Now, @User, @PrincipalApp, @AllowUnmapped,
        m.LatestVersion, m.RetiredAtUtc
    ) AS c;
    UPDATE w
    SET w.KeyLeader = l.Leader, w.KeySeq = IIF(w.RowNo = l.Leader, l.Seq, NULL)
    FROM @Work AS w
    INNER JOIN (
        SELECT v.KeyText, MIN(v.RowNo) AS Leader, ROW_NUMBER() OVER (ORDER BY v.KeyText) AS Seq
        FROM @Work AS v
        WHERE v.KeyText IS NOT NULL AND v.ErrorNumber IS NULL
        GROUP BY v.KeyText
    ) AS l ON w.KeyText = l.KeyText
    WHERE w.ErrorNumber IS NULL;
    UPDATE f
    SET f.ErrorNumber = 50116, f.Field = N'IdempotencyKey', f.Message = CONCAT(N'IdempotencyKey ''',
        LEFT(f.IdempotencyKey, 200), N''' is used by row ', l.RowNo, N' of this batch with different content; ',
        N'use a new key for a different mail.')
    FROM @Work AS f
    INNER JOIN @Work AS l ON f.KeyLeader = l.RowNo
    WHERE f.RowNo <> l.RowNo AND f.ContentHash <> l.ContentHash;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0), @Bad INT = (
        SELECT COUNT(*) FROM @Work AS w WHERE w.ErrorNumber IS NOT NULL
    );
    DECLARE @Seq INT = 0, @Keys INT = (SELECT MAX(w.KeySeq) FROM @Work AS w), @Lock INT;
    DECLARE @KeyText NVARCHAR(200), @Resource NVARCHAR(255);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- 3. Keys on exclusive transaction-owned applocks, binary key order (no key-range locks).
        WHILE @Seq < COALESCE(@Keys, 0) AND (@RejectInvalid = 1 OR @Bad = 0)
        BEGIN
            SET @Seq += 1;
            SET @KeyText = (SELECT w.KeyText FROM @Work AS w WHERE w.KeySeq = @Seq);
            SET @Resource = CONCAT(N'mailq.IdempotencyKey:', @KeyText);
            EXEC @Lock = sys.sp_getapplock
                @Resource = @Resource, @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = 10000;
            IF @Lock < 0
            BEGIN
                SELECT
                    @Err = IIF(@Single = 1, 50162, 50225),
                    @Msg = CONCAT(@P, N'IdempotencyKey ''', @KeyText, N''': another transaction enqueueing the same ',
                        N'key held it for 10 s (sp_getapplock returned ', @Lock, N'); retry once it committed.');
                THROW @Err, @Msg, 1;
            END;
        END;
        -- 4. Keys already queued, exact under the locks; FORCESEEK on UX_MailQueue_IdempotencyKey.
        UPDATE w
        SET w.MailID = q.ID, w.MessageID = q.MessageID, w.Created = 0,
            w.ErrorNumber = IIF(q.ContentHash = w.ContentHash, NULL, 50116),
            w.Field = IIF(q.ContentHash = w.ContentHash, NULL, N'IdempotencyKey'),
            w.Message = IIF(q.ContentHash = w.ContentHash, NULL, CONCAT(@P, N'IdempotencyKey ''', w.KeyText,
                N''' already belongs to mail ', q.ID, N' with different content; use a new key for a different mail.'))
        FROM @Work AS w
        INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK)
            ON w.IdempotencyKey = q.IdempotencyKey AND q.IdempotencyKey IS NOT NULL
        WHERE w.KeySeq <= @Seq;
        -- Suppressed recipients: shared key-range locks on mailq.Suppression held to commit.
        UPDATE w
        SET w.ToAddress = ISNULL(f.ToAddress, N''), w.CC = f.CC, w.BCC = f.BCC, w.Suppressed = f.Suppressed,
            w.ErrorNumber = IIF(f.EntriesLeft = 0, 50600, NULL), w.Field = IIF(f.EntriesLeft = 0, N'ToAddress', NULL),
            w.Message = IIF(f.EntriesLeft = 0, LEFT(CONCAT(N'Every recipient is suppressed for account ''',
                w.AccountName, N''' (mailq.ListSuppressions): ', f.Suppressed), 2048), NULL)
        FROM @Work AS w
        CROSS APPLY mailq.FilterSuppressedRecipients(w.AccountName, w.AppName, w.ToAddress, w.CC, w.BCC) AS f
        WHERE w.ErrorNumber IS NULL AND w.MailID IS NULL AND (w.KeyLeader IS NULL OR w.KeySeq IS NOT NULL)
            AND f.SuppressedCount > 0;
        UPDATE f
        SET f.ErrorNumber = l.ErrorNumber, f.Field = l.Field, f.Message = l.Message
        FROM @Work AS f
        INNER JOIN @Work AS l ON f.KeyLeader = l.RowNo
        WHERE f.RowNo <> l.RowNo AND f.ErrorNumber IS NULL AND l.ErrorNumber IS NOT NULL;
        SET @Bad = (SELECT COUNT(*) FROM @Work AS w WHERE w.ErrorNumber IS NOT NULL);
        IF @RejectInvalid = 0 AND @Bad > 0
        BEGIN
            SELECT TOP (1)
                @Err = IIF(@Single = 1, w.ErrorNumber, 50220),
                @Msg = IIF(@Single = 1, w.Message, LEFT(CONCAT(N'Row ', w.RowNo, N', field ', w.Field, N', rule ',
                    w.ErrorNumber, N': ', w.Message, IIF(@Bad > 1, CONCAT(N' (', @Bad - 1, N' other rows are ',
                    N'invalid too; @RejectInvalid = 1 lists them all.)'), N''), N' Nothing was queued.'), 2048))
            FROM @Work AS w
            WHERE w.ErrorNumber IS NOT NULL
            ORDER BY w.RowNo;
            THROW @Err, @Msg, 1;
        END;
        -- 6. One INSERT, IDs in RowNo order (INSERT ... SELECT ... ORDER BY); MessageID maps them back.
        INSERT INTO mailq.MailQueue (
            dtStamp, DateToProcess, VisibleAtUtc, FromName, FromAddress, ReplyTo, ToAddress, CC, BCC, Subject,
            Body, BodyFormat, TextBody, Headers, Status, AttemptsRemaining, Priority, AccountName, AppName,
            IdempotencyKey, ContentHash, MessageID, ExpiresAtUtc, RunMode, TemplateName, TemplateVersion, TemplateModel
        )
        OUTPUT inserted.ID, inserted.MessageID, inserted.AppName INTO @Inserted (MailID, MessageID, AppName)
        SELECT
            @Now, w.DueUtc AS DateToProcess, w.DueUtc AS VisibleAtUtc, w.FromName, w.FromAddress, w.ReplyTo,
            ISNULL(w.ToAddress, N''), w.CC, w.BCC, w.Subject, w.Body, w.BodyFormat, w.TextBody, w.Headers, N'UnSent',
            w.MaxAttempts, w.Priority, w.AccountName, w.AppName, w.IdempotencyKey, w.ContentHash, w.MessageID,
            w.ExpiresAtUtc, w.RunMode, w.TemplateName, w.TemplateVersion, w.TemplateModel
        FROM @Work AS w
        WHERE w.ErrorNumber IS NULL AND w.MailID IS NULL AND (w.KeyLeader IS NULL OR w.KeySeq IS NOT NULL)
        ORDER BY w.RowNo;
        UPDATE w SET w.MailID = i.MailID, w.Created = 1
        FROM @Work AS w INNER JOIN @Inserted AS i ON w.MessageID = i.MessageID;
        -- Only canonical base64 reaches the decoder, so it cannot fail.
        BEGIN TRY
            INSERT INTO mailq.MailAttachment (
                MailID, AttachmentNo, FileName, ContentType, Content, Generator, GeneratorArgs
            )
            SELECT
                w.MailID, t.AttachmentNo, LTRIM(RTRIM(t.FileName)),
                COALESCE(t.ContentType, N'application/octet-stream'), b.Content, t.Generator,
                IIF(t.Generator IS NULL, NULL, t.GeneratorArgs)
            FROM @Work AS w
            CROSS APPLY mailq.MailAttachmentList(w.Attachments) AS t
            OUTER APPLY OPENJSON (IIF(t.Base64Ok = 1, CONCAT(N'{"c":"', t.ContentBase64, N'"}'), NULL))
                WITH (Content VARBINARY(MAX) '$.c') AS b
            WHERE w.Created = 1;
        END TRY
        BEGIN CATCH
            SELECT
                @Err = IIF(@Single = 1, 50117, 50224),
                @Msg = CONCAT(@P, N'Attachments: a ContentBase64 could not be decoded (', ERROR_MESSAGE(), N').');
            THROW @Err, @Msg, 1;
        END CATCH;
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT i.MailID, i.AppName, e.EventType, N'UnSent', 0, NULL, e.Detail, @Now
        FROM @Inserted AS i
        INNER JOIN @Work AS w ON i.MailID = w.MailID
        CROSS APPLY (VALUES (1, N'Enqueued', NULL), (2, N'RecipientSuppressed',
            LEFT(CONCAT(N'not sent to (suppressed): ', w.Suppressed), 4000))) AS e(EventNo, EventType, Detail)
        WHERE e.EventNo = 1 OR w.Suppressed IS NOT NULL
        ORDER BY i.MailID, e.EventNo;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    UPDATE f SET f.MailID = l.MailID, f.MessageID = l.MessageID, f.Created = 0
    FROM @Work AS f
    INNER JOIN @Work AS l ON f.KeyLeader = l.RowNo
    WHERE f.RowNo <> l.RowNo AND f.ErrorNumber IS NULL;
    IF @Single = 1
        SELECT @MailID = w.MailID, @MessageID = w.MessageID, @Created = w.Created FROM @Work AS w;
    ELSE
    BEGIN
        SELECT w.RowNo, w.MailID, w.MessageID, w.Created FROM @Work AS w WHERE w.ErrorNumber IS NULL ORDER BY w.RowNo;
        SELECT w.RowNo, w.Field, w.ErrorNumber, w.Message
        FROM @Work AS w WHERE w.ErrorNumber IS NOT NULL ORDER BY w.RowNo;
    END;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.EnqueueMail: validates and queues one mail (a key queued with the same content returns its mail).
Parameters:  a recipient in @ToAddress, @CC or @BCC; @Subject, @Body unless @TemplateName;
             the rest optional, NULL = the default (docs/enqueue.md).
Outputs:     @MailID, @MessageID, @Created (0: the key's mail); no result set (triggers may call it).
Errors:      50101-50121, 50160, 50161, 50168, 50240, 50280-50286, 50500, 50600 (the rule broken,
             docs/errors.md); 50116 key reused with other content; 50162 key lock not granted in 10 s.
Transaction: its own if none is open, else the caller's (also distributed); an error dooms it.
Isolation:   READ COMMITTED and the filtered-index SET options, set by mailq.EnqueueMailRows.
Lock order:  the key's application lock, mailq.Suppression (shared, held), mailq.MailQueue, MailAttachment, MailEvent.
Example:     EXEC mailq.EnqueueMail @ToAddress = N'ops@example.com', @Subject = N'Report', @Body = N'Done.';
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMail
    @ToAddress NVARCHAR(MAX) = NULL,
    @Subject NVARCHAR(MAX) = NULL,
    @Body NVARCHAR(MAX) = NULL,
    @BodyFormat NVARCHAR(20) = NULL,
    @TextBody NVARCHAR(MAX) = NULL,
    @CC NVARCHAR(MAX) = NULL,
    @BCC NVARCHAR(MAX) = NULL,
    @FromAddress NVARCHAR(MAX) = NULL,
    @FromName NVARCHAR(MAX) = NULL,
    @ReplyTo NVARCHAR(MAX) = NULL,
    @Headers NVARCHAR(MAX) = NULL,
    @AccountName NVARCHAR(4000) = NULL,
    @AppName NVARCHAR(4000) = NULL,
    @Priority INT = NULL,
    @DateToProcess DATETIME2(3) = NULL,
    @ExpiresAtUtc DATETIME2(3) = NULL,
    @MaxAttempts INT = NULL,
    @IdempotencyKey NVARCHAR(4000) = NULL,
    @Attachments NVARCHAR(MAX) = NULL,
    @MailID BIGINT = NULL OUTPUT,
    @MessageID NVARCHAR(255) = NULL OUTPUT,
    @Created BIT = NULL OUTPUT,
    @RunMode NVARCHAR(4000) = NULL,
    @TemplateName NVARCHAR(4000) = NULL,
    @TemplateVersion INT = NULL,
    @TemplateModel NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    EXEC mailq.EnqueueMailRows
        @Single = 1,
        @ToAddress = @ToAddress, @Subject = @Subject, @Body = @Body, @BodyFormat = @BodyFormat,
        @TextBody = @TextBody, @CC = @CC, @BCC = @BCC, @FromAddress = @FromAddress, @FromName = @FromName,
        @ReplyTo = @ReplyTo, @Headers = @Headers, @AccountName = @AccountName, @AppName = @AppName,
        @Priority = @Priority, @DateToProcess = @DateToProcess, @ExpiresAtUtc = @ExpiresAtUtc,
        @MaxAttempts = @MaxAttempts, @IdempotencyKey = @IdempotencyKey, @Attachments = @Attachments,
        @RunMode = @RunMode, @TemplateName = @TemplateName, @TemplateVersion = @TemplateVersion,
        @TemplateModel = @TemplateModel,
        @MailID = @MailID OUTPUT, @MessageID = @MessageID OUTPUT, @Created = @Created OUTPUT;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.EnqueueMailBatch: queues up to 10,000 mails in one call, each with EnqueueMail's rules.
Parameters:  @Mails (JSON array of objects named like EnqueueMail's parameters) or @MailRows (READONLY),
             exactly one, at most 256 MB; @RejectInvalid BIT: 0 (default) all or nothing, 1 the valid rows.
Result sets: 1. RowNo, MailID, MessageID, Created (0: the key's mail); 2. rejected rows:
             RowNo, Field, ErrorNumber (EnqueueMail's, or 50223), Message.
Errors:      50220 a row invalid (row, field, rule); 50221 input shape; 50222 row count; 50224
             bad base64; 50225 key lock not granted in 10 s; 50226 over 256 MB.  Nothing written.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: set by the core.
Lock order:  the keys' application locks in binary key order, mailq.Suppression (shared, held),
             mailq.MailQueue, mailq.MailAttachment, mailq.MailEvent.
Example:     EXEC mailq.EnqueueMailBatch @Mails = N'[{"ToAddress": "a@example.com", "Body": "B"}]';
*/
CREATE OR ALTER PROCEDURE mailq.EnqueueMailBatch
    @Mails NVARCHAR(MAX) = NULL,
    @MailRows mailq.MailBatchRow READONLY,
    @RejectInvalid BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    DECLARE @Msg NVARCHAR(2048), @Rows BIGINT, @Bytes BIGINT;
    DECLARE @RowsGiven BIT = IIF(EXISTS (SELECT 1 FROM @MailRows), 1, 0);   -- an omitted TVP is empty
    IF (@Mails IS NULL AND @RowsGiven = 0) OR (@Mails IS NOT NULL AND @RowsGiven = 1)
        THROW 50221,
            N'Give the mails in exactly one of @Mails (a JSON array of objects) and @MailRows (mailq.MailBatchRow).',
            1;
    IF @Mails IS NOT NULL
    BEGIN
        SET @Bytes = DATALENGTH(@Mails);
        IF @Bytes <= 268435456
        BEGIN
            IF ISJSON(@Mails) = 0
                OR LEFT(LTRIM(TRANSLATE(LEFT(@Mails, 4000), NCHAR(9) + NCHAR(10) + NCHAR(13), N'   ')), 1) <> N'['
                THROW 50221,
                    N'@Mails must be a JSON array of objects, e.g. [{"ToAddress": "a@x.org", "Body": "B"}].', 1;
            SELECT TOP (1) @Msg = CONCAT(N'@Mails: element ', CAST(e.[key] AS INT) + 1, N' is not a JSON object.')
            FROM OPENJSON(@Mails) AS e
            WHERE e.[type] <> 5
            ORDER BY CAST(e.[key] AS INT);
            IF @Msg IS NOT NULL THROW 50221, @Msg, 1;
            SET @Rows = (SELECT COUNT_BIG(*) FROM OPENJSON(@Mails));
        END;
    END;
    ELSE
        SELECT
            @Rows = COUNT_BIG(*),
            @Bytes = SUM(
                CAST(COALESCE(DATALENGTH(r.Body), 0) AS BIGINT) + COALESCE(DATALENGTH(r.TextBody), 0)
                + COALESCE(DATALENGTH(r.Headers), 0) + COALESCE(DATALENGTH(r.Attachments), 0)
                + COALESCE(DATALENGTH(r.ToAddress), 0) + COALESCE(DATALENGTH(r.CC), 0)
                + COALESCE(DATALENGTH(r.BCC), 0) + COALESCE(DATALENGTH(r.Subject), 0)
                + COALESCE(DATALENGTH(r.TemplateModel), 0)
            )
        FROM @MailRows AS r;
    IF @Bytes > 268435456
    BEGIN
        SET @Msg = CONCAT(IIF(@Mails IS NULL, N'@MailRows', N'@Mails'), N' holds ', @Bytes,
            N' bytes of text; a batch takes at most 268435456 (256 MB): split it into smaller batches.');
        THROW 50226, @Msg, 1;
    END;
    IF @Rows NOT BETWEEN 1 AND 10000
    BEGIN
        SET @Msg = CONCAT(IIF(@Mails IS NULL, N'@MailRows', N'@Mails'), N' holds ', @Rows,
            N' mails; a batch takes 1-10000.');
        THROW 50222, @Msg, 1;
    END;
    -- WITH RECOMPILE: a plan for this batch's rows; the cached plan stays the single call's.
    EXEC mailq.EnqueueMailRows @Rows = @MailRows, @Mails = @Mails, @RejectInvalid = @RejectInvalid WITH RECOMPILE;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.CheckClaimRequest (internal: mailq.ClaimMail's parameter checks, before its
transaction; granted to nobody, reached through ownership chaining).
Parameters:  ClaimMail's, same names and types, defaults already applied:
             @BatchSize INT, @LockToken UNIQUEIDENTIFIER, @LeaseSeconds INT,
             @AppName, @WorkerName NVARCHAR(4000), @AccountNames NVARCHAR(MAX),
             @RunModes NVARCHAR(MAX) (NULL already made ["prod"]).
Result set:  none.
Errors:      ClaimMail's 50130 @BatchSize, 50131 @LockToken, 50132 @LeaseSeconds,
             50103 a name over 128, 50115 @AppName not registered, 50148 @AccountNames,
             50241 @RunModes, in that order; THROW under XACT_ABORT ON, as in ClaimMail.
Transaction: none of its own; writes nothing (inside the caller's, if one is open).
Isolation:   READ COMMITTED (as ClaimMail); one plain read of mailq.Application.
Lock order:  mailq.Application only (shared, statement-long).
Example:     EXEC mailq.CheckClaimRequest @BatchSize = 10, @LockToken = @T, @LeaseSeconds = 300,
                 @AppName = NULL, @WorkerName = NULL, @AccountNames = NULL, @RunModes = N'["prod"]';
*/
CREATE OR ALTER PROCEDURE mailq.CheckClaimRequest
    @BatchSize INT,
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT,
    @AppName NVARCHAR(4000),
    @WorkerName NVARCHAR(4000),
    @AccountNames NVARCHAR(MAX),
    @RunModes NVARCHAR(MAX)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50130, @Msg, 1;
    END;
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: a new GUID per claimed batch.', 1;
    IF @LeaseSeconds NOT BETWEEN 1 AND 3600
    BEGIN
        SET @Msg = CONCAT(N'@LeaseSeconds must be 1-3600; got ', @LeaseSeconds, N'.');
        THROW 50132, @Msg, 1;
    END;
    IF LEN(@AppName) > 128 OR LEN(@WorkerName) > 128
        THROW 50103, N'@AppName and @WorkerName are limited to 128 characters.', 1;
    IF @AppName IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(N'@AppName ''', @AppName, N''' is not a registered application.');
        THROW 50115, @Msg, 1;
    END;
    -- Separate statements, not one OR: ISJSON/OPENJSON evaluation order is not guaranteed.
    DECLARE @AccountsOk BIT = 1;
    IF @AccountNames IS NOT NULL
    BEGIN
        IF ISJSON(@AccountNames) = 0 OR LEFT(LTRIM(@AccountNames), 1) <> N'['
            SET @AccountsOk = 0;
        ELSE IF EXISTS (SELECT 1 FROM OPENJSON(@AccountNames) AS j WHERE j.[type] <> 1)
            SET @AccountsOk = 0;
    END;
    IF @AccountsOk = 0
        THROW 50148, N'@AccountNames must be a JSON array of account names, e.g. ["default", "overseas"].', 1;
    DECLARE @RunModesOk BIT = 1;
    IF ISJSON(@RunModes) = 0 OR LEFT(LTRIM(@RunModes), 1) <> N'['
        SET @RunModesOk = 0;
    ELSE IF (SELECT COUNT(*) FROM OPENJSON(@RunModes)) NOT BETWEEN 1 AND 16
        SET @RunModesOk = 0;
    ELSE IF EXISTS (
        SELECT 1
        FROM OPENJSON(@RunModes) AS j
        WHERE
            j.[type] <> 1
            OR LEN(j.[value]) NOT BETWEEN 1 AND 32
            OR j.[value] COLLATE Latin1_General_100_BIN2 NOT LIKE N'[a-z]%'
            OR j.[value] COLLATE Latin1_General_100_BIN2 LIKE N'%[^a-z0-9_-]%'
    )
        SET @RunModesOk = 0;
    IF @RunModesOk = 0
    BEGIN
        SET @Msg = CONCAT(
            N'@RunModes must be a JSON array of 1-16 run-mode names (a-z first, then a-z 0-9 - _, ',
            N'at most 32 characters), e.g. ["prod"] or ["staging", "test"].'
        );
        THROW 50241, @Msg, 1;
    END;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ClaimMail: leases up to @BatchSize due mails to one worker; reads and locks grow with the
batch and the accounts that can send now, never with mail it cannot take (docs/claim.md).
Parameters:  @BatchSize INT 1-1000, default 10; @LockToken UNIQUEIDENTIFIER, required; @LeaseSeconds
             INT 1-3600, default 300; @AppName NULL: every application's mail, a name: only its own;
             @WorkerName; @AccountNames, @RunModes: JSON arrays served (NULL: all accounts, ["prod"]).
Result sets: 1. the mails leased: their columns, AttemptNo, LeaseExpiresUtc, PossibleDuplicate, DryRun,
                the template's name, version, model, LeaseSecondsRemaining (INT, whole seconds, floored)
             2. attachments (Content NULL: Generator makes it); 3. the template versions to render
Errors:      50130 @BatchSize, 50131 @LockToken, 50132 @LeaseSeconds, 50103 a name over 128,
             50115 @AppName not registered, 50148 @AccountNames, 50241 @RunModes
             (checked by mailq.CheckClaimRequest before the transaction).
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED
             (READPAST needs it); its queue reads lock, also under RCSI.
Lock order:  mailq.RateBudget (U), mailq.MailQueue (index keys U, rows X), mailq.MailAttempt, mailq.MailEvent.
Example:     EXEC mailq.ClaimMail @BatchSize = 100, @LockToken = @T, @WorkerName = N'host1/1';
*/
CREATE OR ALTER PROCEDURE mailq.ClaimMail
    @BatchSize INT = 10,
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT = 300,
    @AppName NVARCHAR(4000) = NULL,
    @WorkerName NVARCHAR(4000) = NULL,
    @AccountNames NVARCHAR(MAX) = NULL,
    @RunModes NVARCHAR(MAX) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SET @BatchSize = COALESCE(@BatchSize, 10);
    SET @LeaseSeconds = COALESCE(@LeaseSeconds, 300);
    SET @RunModes = COALESCE(@RunModes, N'["prod"]');
    EXEC mailq.CheckClaimRequest
        @BatchSize = @BatchSize,
        @LockToken = @LockToken,
        @LeaseSeconds = @LeaseSeconds,
        @AppName = @AppName,
        @WorkerName = @WorkerName,
        @AccountNames = @AccountNames,
        @RunModes = @RunModes;
    DECLARE @Served TABLE (AccountName NVARCHAR(128) NOT NULL PRIMARY KEY);
    IF @AccountNames IS NOT NULL
        INSERT INTO @Served (AccountName)
        SELECT DISTINCT CAST(j.[value] AS NVARCHAR(128))
        FROM OPENJSON(@AccountNames) AS j
        WHERE LEN(j.[value]) <= 128;  -- a longer name is no account (never truncated into one)
    DECLARE @Modes TABLE (RunMode NVARCHAR(32) COLLATE Latin1_General_100_BIN2 NOT NULL PRIMARY KEY);
    INSERT INTO @Modes (RunMode)
    SELECT DISTINCT CAST(j.[value] AS NVARCHAR(32)) FROM OPENJSON(@RunModes) AS j;
    DECLARE @Now DATETIME2(3);
    DECLARE @LeaseUntil DATETIME2(3);
    DECLARE @MinuteStart DATETIME2(0);
    DECLARE @HourStart DATETIME2(0);
    DECLARE @DayStart DATETIME2(0);
    DECLARE @Acct TABLE (
        AccountName NVARCHAR(128) NOT NULL PRIMARY KEY,
        IsLimited BIT NOT NULL,
        BlockedUntilUtc DATETIME2(3) NULL,
        PerMinuteLimit INT NULL,
        PerHourLimit INT NULL,
        PerDayLimit INT NULL,
        MinuteStartUtc DATETIME2(0) NULL,
        MinuteCount INT NULL,
        HourStartUtc DATETIME2(0) NULL,
        HourCount INT NULL,
        DayStartUtc DATETIME2(0) NULL,
        DayCount INT NULL,
        Remaining INT NOT NULL DEFAULT (0),
        Taken INT NOT NULL DEFAULT (0)
    );
    DECLARE @Drive TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        RunMode NVARCHAR(32) NOT NULL,
        Taken INT NOT NULL DEFAULT (0),
        Cap INT NOT NULL DEFAULT (0),
        IsOpen BIT NOT NULL DEFAULT (1),
        PRIMARY KEY (AccountName, RunMode)
    );
    DECLARE @Draw TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        RunMode NVARCHAR(32) NOT NULL,
        PRIMARY KEY (AccountName, RunMode)
    );
    DECLARE @Pick TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Claimed TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AccountName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NULL,
        RunMode NVARCHAR(32) NOT NULL,
        OldStatus NVARCHAR(16) NOT NULL,
        OldLockToken UNIQUEIDENTIFIER NULL,
        AttemptNo INT NOT NULL,
        Pass INT NOT NULL,
        TemplateName NVARCHAR(128) NULL,
        TemplateVersion INT NULL
    );
    DECLARE @Pass INT = 0;
    DECLARE @Left INT = @BatchSize;
    DECLARE @Open INT;
    DECLARE @Share INT;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        INSERT INTO @Acct (AccountName, IsLimited, BlockedUntilUtc)
        SELECT a.AccountName, 0, a.BlockedUntilUtc
        FROM mailq.SendingAccount AS a
        WHERE
            a.PerMinuteLimit IS NULL AND a.PerHourLimit IS NULL AND a.PerDayLimit IS NULL
            AND (@AccountNames IS NULL OR a.AccountName IN (SELECT s.AccountName FROM @Served AS s));
        -- UPDLOCK: ours to commit; READPAST, ROWLOCK: skip held budgets; FORCESEEK: a scan locks them all.
        INSERT INTO @Acct (
            AccountName, IsLimited, BlockedUntilUtc, PerMinuteLimit, PerHourLimit, PerDayLimit,
            MinuteStartUtc, MinuteCount, HourStartUtc, HourCount, DayStartUtc, DayCount
        )
        SELECT
            a.AccountName, 1, a.BlockedUntilUtc, a.PerMinuteLimit, a.PerHourLimit, a.PerDayLimit,
            b.MinuteStartUtc, b.MinuteCount, b.HourStartUtc, b.HourCount, b.DayStartUtc, b.DayCount
        FROM mailq.SendingAccount AS a
        INNER JOIN mailq.RateBudget AS b WITH (FORCESEEK, UPDLOCK, READPAST, ROWLOCK)
            ON a.AccountName = b.AccountName
        WHERE
            (a.PerMinuteLimit IS NOT NULL OR a.PerHourLimit IS NOT NULL OR a.PerDayLimit IS NOT NULL)
            AND (@AccountNames IS NULL OR a.AccountName IN (SELECT s.AccountName FROM @Served AS s));
        SET @Now = SYSUTCDATETIME();
        SET @LeaseUntil = DATEADD(SECOND, @LeaseSeconds, @Now);
        SET @MinuteStart = DATEADD(MINUTE, DATEDIFF(MINUTE, '20000101', @Now), '20000101');
        SET @HourStart = DATEADD(HOUR, DATEDIFF(HOUR, '20000101', @Now), '20000101');
        SET @DayStart = CAST(CAST(@Now AS DATE) AS DATETIME2(0));
        DELETE FROM @Acct WHERE BlockedUntilUtc > @Now;
        UPDATE a
        SET a.Remaining = IIF(
            a.IsLimited = 0,
            @BatchSize,
            (
                SELECT MIN(w.Remaining)
                FROM (
                    VALUES
                    (COALESCE(a.PerMinuteLimit - IIF(a.MinuteStartUtc >= @MinuteStart, a.MinuteCount, 0), @BatchSize)),
                    (COALESCE(a.PerHourLimit - IIF(a.HourStartUtc >= @HourStart, a.HourCount, 0), @BatchSize)),
                    (COALESCE(a.PerDayLimit - IIF(a.DayStartUtc >= @DayStart, a.DayCount, 0), @BatchSize))
                ) AS w(Remaining)
            )
        )
        FROM @Acct AS a;
        DELETE FROM @Acct WHERE Remaining <= 0;
        UPDATE @Acct SET Remaining = @BatchSize WHERE Remaining > @BatchSize;
        INSERT INTO @Drive (AccountName, RunMode)
        SELECT a.AccountName, m.RunMode
        FROM @Acct AS a
        CROSS JOIN @Modes AS m;
        -- More pairs than slots: drop pairs without claimable mail (probes keep no lock), draw @BatchSize.
        IF (SELECT COUNT(*) FROM @Drive) > @BatchSize
        BEGIN
            IF @AppName IS NULL
                DELETE FROM d
                FROM @Drive AS d
                WHERE NOT EXISTS (
                    SELECT 1
                    FROM mailq.MailQueue AS k WITH (
                        INDEX (IX_MailQueue_ClaimByAccount), FORCESEEK, READPAST, READCOMMITTEDLOCK
                    )
                    WHERE
                        k.AccountName = d.AccountName
                        AND k.RunMode = d.RunMode
                        AND k.Status IN (N'UnSent', N'Sending')
                        AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                        AND k.VisibleAtUtc <= @Now
                        AND k.AttemptsRemaining > 0
                        AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                );
            ELSE
                DELETE FROM d
                FROM @Drive AS d
                WHERE NOT EXISTS (
                    SELECT 1
                    FROM mailq.MailQueue AS k WITH (
                        INDEX (IX_MailQueue_ClaimByApp), FORCESEEK, READPAST, READCOMMITTEDLOCK
                    )
                    WHERE
                        k.AccountName = d.AccountName
                        AND k.RunMode = d.RunMode
                        AND k.AppName = @AppName
                        AND k.AppName IS NOT NULL
                        AND k.Status IN (N'UnSent', N'Sending')
                        AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                        AND k.VisibleAtUtc <= @Now
                        AND k.AttemptsRemaining > 0
                        AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                );
            IF (SELECT COUNT(*) FROM @Drive) > @BatchSize
            BEGIN
                -- Materialized first: NEWID() in the DELETE's predicate may be evaluated again.
                INSERT INTO @Draw (AccountName, RunMode)
                SELECT TOP (@BatchSize) r.AccountName, r.RunMode FROM @Drive AS r ORDER BY NEWID();
                DELETE FROM d
                FROM @Drive AS d
                WHERE NOT EXISTS (
                    SELECT 1 FROM @Draw AS w
                    WHERE w.AccountName = d.AccountName AND w.RunMode = d.RunMode
                );
            END;
        END;
        WHILE @Pass < 3 AND @Left > 0
        BEGIN
            SET @Pass += 1;
            SELECT @Open = COUNT(*)
            FROM @Drive AS d
            INNER JOIN @Acct AS a ON d.AccountName = a.AccountName
            WHERE d.IsOpen = 1 AND a.Remaining > a.Taken;
            IF @Open = 0 BREAK;
            SET @Share = IIF(@Left / @Open < 1, 1, @Left / @Open);
            UPDATE @Drive SET Cap = 0;
            UPDATE d
            SET d.Cap = IIF(x.Part < @Share, x.Part, @Share)
            FROM @Drive AS d
            INNER JOIN (
                SELECT
                    o.AccountName,
                    o.RunMode,
                    o.Rest / o.Pairs + IIF(o.Seq <= o.Rest % o.Pairs, 1, 0) AS Part
                FROM (
                    SELECT
                        d2.AccountName,
                        d2.RunMode,
                        a.Remaining - a.Taken AS Rest,
                        COUNT(*) OVER (PARTITION BY d2.AccountName) AS Pairs,
                        ROW_NUMBER() OVER (PARTITION BY d2.AccountName ORDER BY NEWID()) AS Seq
                    FROM @Drive AS d2
                    INNER JOIN @Acct AS a ON d2.AccountName = a.AccountName
                    WHERE d2.IsOpen = 1 AND a.Remaining > a.Taken
                ) AS o
            ) AS x ON d.AccountName = x.AccountName AND d.RunMode = x.RunMode;
            -- The pick: INDEX + FORCESEEK, never a scan; READPAST, UPDLOCK, ROWLOCK: skip held rows, keep ours.
            DELETE FROM @Pick;
            IF @AppName IS NULL
                INSERT INTO @Pick (ID)
                SELECT TOP (@Left) c.ID
                FROM (SELECT r.AccountName, r.RunMode, r.Cap FROM @Drive AS r WHERE r.Cap > 0) AS d
                CROSS APPLY (
                    SELECT TOP (d.Cap)
                        k.ID,
                        k.Priority,
                        k.VisibleAtUtc,
                        ROW_NUMBER() OVER (ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC) AS Turn
                    FROM mailq.MailQueue AS k WITH (
                        INDEX (IX_MailQueue_ClaimByAccount), FORCESEEK, READPAST, UPDLOCK, ROWLOCK
                    )
                    WHERE
                        k.AccountName = d.AccountName
                        AND k.RunMode = d.RunMode
                        AND k.Status IN (N'UnSent', N'Sending')
                        AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                        AND k.VisibleAtUtc <= @Now
                        AND k.AttemptsRemaining > 0
                        AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                    ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC
                ) AS c
                ORDER BY c.Turn ASC, c.Priority DESC, c.VisibleAtUtc ASC, c.ID ASC;
            ELSE
                INSERT INTO @Pick (ID)
                SELECT TOP (@Left) c.ID
                FROM (SELECT r.AccountName, r.RunMode, r.Cap FROM @Drive AS r WHERE r.Cap > 0) AS d
                CROSS APPLY (
                    SELECT TOP (d.Cap)
                        k.ID,
                        k.Priority,
                        k.VisibleAtUtc,
                        ROW_NUMBER() OVER (ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC) AS Turn
                    FROM mailq.MailQueue AS k WITH (
                        INDEX (IX_MailQueue_ClaimByApp), FORCESEEK, READPAST, UPDLOCK, ROWLOCK
                    )
                    WHERE
                        k.AccountName = d.AccountName
                        AND k.RunMode = d.RunMode
                        AND k.AppName = @AppName
                        AND k.AppName IS NOT NULL
                        AND k.Status IN (N'UnSent', N'Sending')
                        AND k.Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                        AND k.VisibleAtUtc <= @Now
                        AND k.AttemptsRemaining > 0
                        AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now)
                    ORDER BY k.Priority DESC, k.VisibleAtUtc ASC, k.ID ASC
                ) AS c
                ORDER BY c.Turn ASC, c.Priority DESC, c.VisibleAtUtc ASC, c.ID ASC;
            -- The lease, re-checked; READPAST: our key U and another's clustered X cannot deadlock.
            UPDATE q
            SET
                q.Status = N'Sending',
                q.ThreadLock = @LockToken,
                q.VisibleAtUtc = @LeaseUntil,
                q.AttemptsRemaining = q.AttemptsRemaining - 1,
                q.AttemptCount = q.AttemptCount + 1,
                -- An expired lease may hide a mail already handed to SMTP.
                q.PossibleDuplicate = IIF(q.Status = N'Sending', CAST(1 AS BIT), q.PossibleDuplicate),
                q.DryRun = COALESCE(
                    (SELECT ap.DryRun FROM mailq.Application AS ap WHERE ap.AppName = q.AppName),
                    CAST(0 AS BIT)
                )
            OUTPUT
                inserted.ID,
                inserted.AccountName,
                inserted.AppName,
                inserted.RunMode,
                deleted.Status,
                deleted.ThreadLock,
                inserted.AttemptCount,
                @Pass,
                inserted.TemplateName,
                inserted.TemplateVersion
            INTO @Claimed (
                ID, AccountName, AppName, RunMode, OldStatus, OldLockToken, AttemptNo, Pass,
                TemplateName, TemplateVersion
            )
            FROM mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)), READPAST, UPDLOCK, ROWLOCK)
            WHERE
                q.ID IN (SELECT p.ID FROM @Pick AS p)
                AND q.Status IN (N'UnSent', N'Sending')
                AND q.VisibleAtUtc <= @Now
                AND q.AttemptsRemaining > 0;
            UPDATE d
            SET
                d.Taken = d.Taken + COALESCE(n.Claimed, 0),
                d.IsOpen = IIF(COALESCE(n.Claimed, 0) < d.Cap, 0, d.IsOpen)
            FROM @Drive AS d
            LEFT JOIN (
                SELECT m.AccountName, m.RunMode, COUNT(*) AS Claimed
                FROM @Claimed AS m
                WHERE m.Pass = @Pass
                GROUP BY m.AccountName, m.RunMode
            ) AS n ON d.AccountName = n.AccountName AND d.RunMode = n.RunMode
            WHERE d.Cap > 0;
            UPDATE a
            SET a.Taken = n.Claimed
            FROM @Acct AS a
            INNER JOIN (
                SELECT m.AccountName, COUNT(*) AS Claimed
                FROM @Claimed AS m
                GROUP BY m.AccountName
            ) AS n ON a.AccountName = n.AccountName;
            SET @Left = @BatchSize - (SELECT COUNT(*) FROM @Claimed);
        END;
        UPDATE b
        SET
            b.MinuteCount = IIF(b.MinuteStartUtc >= @MinuteStart, b.MinuteCount, 0) + a.Taken,
            b.MinuteStartUtc = IIF(b.MinuteStartUtc >= @MinuteStart, b.MinuteStartUtc, @MinuteStart),
            b.HourCount = IIF(b.HourStartUtc >= @HourStart, b.HourCount, 0) + a.Taken,
            b.HourStartUtc = IIF(b.HourStartUtc >= @HourStart, b.HourStartUtc, @HourStart),
            b.DayCount = IIF(b.DayStartUtc >= @DayStart, b.DayCount, 0) + a.Taken,
            b.DayStartUtc = IIF(b.DayStartUtc >= @DayStart, b.DayStartUtc, @DayStart)
        FROM mailq.RateBudget AS b WITH (FORCESEEK, ROWLOCK)  -- only the budget rows U-locked above
        INNER JOIN @Acct AS a ON b.AccountName = a.AccountName
        WHERE a.IsLimited = 1 AND a.Taken > 0;
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Abandoned',
            t.ErrorText = N'Lease expired before the worker acknowledged; reclaimed.'
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek by mail ID, never a scan
        INNER JOIN @Claimed AS c
            ON t.MailID = c.ID AND t.LockToken = c.OldLockToken
        WHERE c.OldStatus = N'Sending' AND t.EndedAtUtc IS NULL;
        UPDATE c
        SET c.TemplateVersion = COALESCE(c.TemplateVersion, IIF(t.RetiredAtUtc IS NULL, t.LatestVersion, NULL))
        FROM @Claimed AS c
        INNER JOIN mailq.MailTemplate AS t WITH (FORCESEEK) ON c.TemplateName = t.TemplateName
        WHERE c.TemplateName IS NOT NULL;
        INSERT INTO mailq.MailAttempt (MailID, AttemptNo, LockToken, WorkerName, StartedAtUtc, TemplateVersion)
        SELECT c.ID, c.AttemptNo, @LockToken, @WorkerName, @Now, c.TemplateVersion
        FROM @Claimed AS c;
        -- Events (docs/events.md): two statements, so LeaseExpired is stamped before Claimed.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT
            c.ID, c.AppName, N'LeaseExpired', N'Sending', c.AttemptNo - 1, NULL,
            N'Lease expired before the worker acknowledged; reclaimed (PossibleDuplicate).', @Now
        FROM @Claimed AS c
        WHERE c.OldStatus = N'Sending';
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT c.ID, c.AppName, N'Claimed', N'Sending', c.AttemptNo, NULL, @WorkerName, @Now
        FROM @Claimed AS c;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    DECLARE @ReturnedAt DATETIME2(3) = SYSUTCDATETIME();
    SELECT
        q.ID,
        q.MessageID,
        q.AccountName,
        q.AppName,
        q.FromName,
        q.FromAddress,
        q.ReplyTo,
        q.ToAddress,
        q.CC,
        q.BCC,
        q.Subject,
        q.Body,
        q.BodyFormat,
        q.TextBody,
        q.Headers,
        q.Priority,
        q.AttemptCount AS AttemptNo,
        q.AttemptsRemaining,
        q.VisibleAtUtc AS LeaseExpiresUtc,
        q.PossibleDuplicate,
        q.dtStamp,
        q.RunMode,
        q.DryRun,
        c.TemplateName,
        c.TemplateVersion,
        q.TemplateModel,
        CAST(FLOOR(DATEDIFF_BIG(MILLISECOND, @ReturnedAt, q.VisibleAtUtc) / 1000.0) AS INT) AS LeaseSecondsRemaining
    FROM mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)))
    INNER JOIN @Claimed AS c ON q.ID = c.ID
    WHERE q.ThreadLock = @LockToken
    ORDER BY q.Priority DESC, q.ID ASC;
    SELECT
        a.MailID,
        a.AttachmentNo,
        a.FileName,
        a.ContentType,
        a.Content,
        a.Generator,
        a.GeneratorArgs
    FROM mailq.MailAttachment AS a WITH (FORCESEEK (PK_MailAttachment (MailID)))
    INNER JOIN @Claimed AS c ON a.MailID = c.ID
    ORDER BY a.MailID ASC, a.AttachmentNo ASC;
    WITH Used AS (
        SELECT DISTINCT c.TemplateName, c.TemplateVersion
        FROM @Claimed AS c
        WHERE c.TemplateVersion IS NOT NULL
    )

    SELECT
        v.TemplateName,
        v.Version,
        v.SubjectTemplate,
        v.HtmlTemplate,
        v.TextTemplate
    FROM Used AS u
    INNER JOIN mailq.MailTemplateVersion AS v WITH (FORCESEEK)  -- one seek per distinct version
        ON u.TemplateName = v.TemplateName AND u.TemplateVersion = v.Version
    ORDER BY v.TemplateName ASC, v.Version ASC;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.FinalizeMail: in small batches, moves mail that can never be sent to Failed (no attempt
left, last lease expired) or Expired (past ExpiresAtUtc, no live lease), so the claim never has to.
Parameters:  @BatchSize INT 1-1000, default 200 (per statement); @MaxBatches INT 1-1000, default 50
Result set:  FailedCount, ExpiredCount, MoreLeft BIT (call again), Busy BIT (another finalizer ran)
Errors:      50150 @BatchSize, 50151 @MaxBatches out of range; 50152 called inside a transaction.
Transaction: refuses one (50152); each batch commits on its own, also in implicit transaction
             mode (turned off inside); an error rolls back the batch under way and is re-raised.
Isolation:   sets READ COMMITTED (READPAST needs it).  Example: EXEC mailq.FinalizeMail @BatchSize = 200;
Lock order:  the application lock N'mailq.FinalizeMail' (batch-owned, never waited for), then
             mailq.MailQueue (keys U, rows X), mailq.MailAttempt, mailq.MailEvent (docs/finalization.md).
*/
CREATE OR ALTER PROCEDURE mailq.FinalizeMail
    @BatchSize INT = 200,
    @MaxBatches INT = 50
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- Off before any statement: under IMPLICIT_TRANSACTIONS ON no batch would commit.
    SET IMPLICIT_TRANSACTIONS OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @BatchSize = COALESCE(@BatchSize, 200);
    SET @MaxBatches = COALESCE(@MaxBatches, 50);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50150, @Msg, 1;
    END;
    IF @MaxBatches NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@MaxBatches must be 1-1000; got ', @MaxBatches, N'.');
        THROW 50151, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50152, N'mailq.FinalizeMail commits batch by batch: call it outside a transaction.', 1;
    DECLARE @Done TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        NewStatus NVARCHAR(16) NOT NULL,
        OldStatus NVARCHAR(16) NOT NULL,
        OldLockToken UNIQUEIDENTIFIER NULL,
        AppName NVARCHAR(128) NULL,
        AttemptCount INT NOT NULL,
        LastError NVARCHAR(4000) NULL
    );
    DECLARE @Now DATETIME2(3);
    DECLARE @Failed INT = 0;
    DECLARE @Expired INT = 0;
    DECLARE @Rows INT;
    DECLARE @ExpiredRows INT;
    DECLARE @Batches INT = 0;
    DECLARE @MoreLeft BIT = 0;
    DECLARE @Busy BIT = 0;
    DECLARE @Lock INT;
    WHILE @Batches < @MaxBatches
    BEGIN
        SET @Batches += 1;
        SET @Now = SYSUTCDATETIME();
        DELETE FROM @Done;
        BEGIN TRY
            BEGIN TRANSACTION;
            -- One finalizer at a time (the two reads below in opposite orders could deadlock).
            EXEC @Lock = sys.sp_getapplock
                @Resource = N'mailq.FinalizeMail', @LockMode = N'Exclusive',
                @LockOwner = N'Transaction', @LockTimeout = 0;
            IF @Lock < 0
            BEGIN
                ROLLBACK TRANSACTION;  -- nothing written in it
                SET @Busy = 1;
                BREAK;
            END;
            -- Out of attempts.  READPAST: skip rows others hold; UPDLOCK, ROWLOCK: claim while reading.
            WITH Dead AS (
                SELECT TOP (@BatchSize)
                    q.ID,
                    q.Status,
                    q.ThreadLock,
                    q.PossibleDuplicate,
                    q.DateProcessed,
                    q.LastError,
                    q.AppName,
                    q.AttemptCount
                FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Finalize), READPAST, UPDLOCK, ROWLOCK)
                WHERE
                    q.Status IN (N'UnSent', N'Sending')
                    AND q.AttemptsRemaining = 0
                    AND q.VisibleAtUtc <= @Now
                ORDER BY q.VisibleAtUtc ASC, q.ID ASC
            )

            UPDATE d
            SET
                d.Status = N'Failed',
                d.ThreadLock = NULL,
                d.PossibleDuplicate = IIF(d.Status = N'Sending', CAST(1 AS BIT), d.PossibleDuplicate),
                d.DateProcessed = @Now,
                d.LastError = LEFT(CONCAT(N'No attempt left after an abandoned lease. Last error: ', d.LastError), 4000)
            OUTPUT
                inserted.ID, inserted.Status, deleted.Status, deleted.ThreadLock,
                inserted.AppName, inserted.AttemptCount, inserted.LastError
            INTO @Done (ID, NewStatus, OldStatus, OldLockToken, AppName, AttemptCount, LastError)
            FROM Dead AS d;
            SET @Rows = @@ROWCOUNT;
            SET @Failed += @Rows;
            WITH Late AS (
                SELECT TOP (@BatchSize)
                    q.ID,
                    q.Status,
                    q.ThreadLock,
                    q.PossibleDuplicate,
                    q.DateProcessed,
                    q.LastError,
                    q.AppName,
                    q.AttemptCount
                FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Expiry), READPAST, UPDLOCK, ROWLOCK)
                WHERE
                    q.Status IN (N'UnSent', N'Sending')
                    AND q.ExpiresAtUtc IS NOT NULL
                    AND q.ExpiresAtUtc <= @Now
                    AND (q.Status = N'UnSent' OR q.VisibleAtUtc <= @Now)
                ORDER BY q.ExpiresAtUtc ASC, q.ID ASC
            )

            UPDATE l
            SET
                l.Status = N'Expired',
                l.ThreadLock = NULL,
                l.PossibleDuplicate = IIF(l.Status = N'Sending', CAST(1 AS BIT), l.PossibleDuplicate),
                l.DateProcessed = @Now,
                l.LastError = N'Expired before it could be sent (ExpiresAtUtc passed).'
            OUTPUT
                inserted.ID, inserted.Status, deleted.Status, deleted.ThreadLock,
                inserted.AppName, inserted.AttemptCount, inserted.LastError
            INTO @Done (ID, NewStatus, OldStatus, OldLockToken, AppName, AttemptCount, LastError)
            FROM Late AS l;
            SET @ExpiredRows = @@ROWCOUNT;
            SET @Expired += @ExpiredRows;
            IF @ExpiredRows > @Rows SET @Rows = @ExpiredRows;
            UPDATE t
            SET
                t.EndedAtUtc = @Now,
                t.Outcome = N'Abandoned',
                t.ErrorText = IIF(
                    d.NewStatus = N'Failed',
                    N'Lease expired before the worker acknowledged; no attempt left.',
                    N'Lease expired before the worker acknowledged; the mail expired.'
                )
            FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)
            INNER JOIN @Done AS d
                ON t.MailID = d.ID AND t.LockToken = d.OldLockToken
            WHERE d.OldStatus = N'Sending' AND t.EndedAtUtc IS NULL;
            INSERT INTO mailq.MailEvent (
                MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc
            )
            SELECT
                d.ID, d.AppName, N'LeaseExpired', N'Sending', d.AttemptCount, NULL,
                N'Lease expired before the worker acknowledged.', @Now
            FROM @Done AS d
            WHERE d.OldStatus = N'Sending';
            INSERT INTO mailq.MailEvent (
                MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc
            )
            SELECT
                d.ID,
                d.AppName,
                d.NewStatus AS EventType,
                d.NewStatus AS Status,
                d.AttemptCount,
                NULL,
                d.LastError,
                @Now
            FROM @Done AS d;
            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;
        IF @Rows < @BatchSize
        BEGIN
            SET @MoreLeft = 0;
            BREAK;
        END;
        SET @MoreLeft = 1;
    END;
    SELECT @Failed AS FailedCount, @Expired AS ExpiredCount, @MoreLeft AS MoreLeft, @Busy AS Busy;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ExtendLease: pushes the leases a worker holds to now + @LeaseSeconds, fenced by the token, all or nothing.
Parameters:  @ID or @IDList (JSON array), exactly one; @LockToken, required; @LeaseSeconds 1-3600, default 300.
Result set:  ID, LeaseExpiresUtc, LeaseSecondsRemaining (INT, floored: count it down on the worker's clock).
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (mailq.LockLeasedMail); 50132 @LeaseSeconds.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.MailQueue only (via mailq.LockLeasedMail).
Example:     EXEC mailq.ExtendLease @IDList = N'[101,102]', @LockToken = @T, @LeaseSeconds = 300;
*/
CREATE OR ALTER PROCEDURE mailq.ExtendLease
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT = 300
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @LeaseSeconds = COALESCE(@LeaseSeconds, 300);
    IF @LeaseSeconds NOT BETWEEN 1 AND 3600
    BEGIN
        SET @Msg = CONCAT(N'@LeaseSeconds must be 1-3600; got ', @LeaseSeconds, N'.');
        THROW 50132, @Msg, 1;
    END;
    DECLARE @LeaseUntil DATETIME2(3) = DATEADD(SECOND, @LeaseSeconds, SYSUTCDATETIME());
    DECLARE @Extended TABLE (ID BIGINT NOT NULL PRIMARY KEY, LeaseExpiresUtc DATETIME2(3) NOT NULL);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;
        UPDATE q
        SET q.VisibleAtUtc = @LeaseUntil
        OUTPUT inserted.ID, inserted.VisibleAtUtc INTO @Extended (ID, LeaseExpiresUtc)
        FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    DECLARE @ReturnedAt DATETIME2(3) = SYSUTCDATETIME();
    SELECT
        e.ID,
        e.LeaseExpiresUtc,
        CAST(FLOOR(DATEDIFF_BIG(MILLISECOND, @ReturnedAt, e.LeaseExpiresUtc) / 1000.0) AS INT) AS LeaseSecondsRemaining
    FROM @Extended AS e
    ORDER BY e.ID;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ReleaseMail: gives back leased mails not sent (e.g. on shutdown): UnSent and
due now, the attempt refunded and closed as Released; fenced by the lock token,
all or nothing.  The rate budget taken is not refunded.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, required.
Result set:  one row per mail: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50131, 50136, 50137, 50201, 50202, 50203 (see mailq.LockLeasedMail).
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (the fence reads with UPDLOCK).
Lock order:  mailq.MailQueue (via LockLeasedMail), mailq.MailAttempt, mailq.MailEvent.
Example:     EXEC mailq.ReleaseMail @IDList = N'[103,104]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.ReleaseMail
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Released TABLE (ID BIGINT NOT NULL PRIMARY KEY, AttemptNo INT NOT NULL, AppName NVARCHAR(128) NULL);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.LockLeasedMail @ID = @ID, @IDList = @IDList, @LockToken = @LockToken;
        UPDATE q
        SET
            q.Status = N'UnSent',
            q.ThreadLock = NULL,
            q.VisibleAtUtc = @Now,
            q.AttemptsRemaining = q.AttemptsRemaining + 1
        OUTPUT inserted.ID, inserted.AttemptCount, inserted.AppName INTO @Released (ID, AttemptNo, AppName)
        FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = N'Released'
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Released AS r ON t.MailID = r.ID AND t.AttemptNo = r.AttemptNo;
        -- One Released event per mail, in this transaction (docs/events.md).
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT r.ID, r.AppName, N'Released', N'UnSent', r.AttemptNo, NULL, NULL, @Now
        FROM @Released AS r;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        r.ID,
        N'UnSent' AS Status,
        @Now AS NextAttemptUtc
    FROM @Released AS r
    ORDER BY r.ID;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MarkSent: records mails as sent; fenced by the lock token and all or nothing
(one call for every mail of one SMTP connection).  Repeatable: a mail this token
already marked Sent is accepted again, unchanged.  A mail claimed with DryRun = 1
is recorded as DryRun whatever @DryRun says (status Sent, event 'DryRun').
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array of 1-1000): exactly one;
             @LockToken UNIQUEIDENTIFIER, required; @SmtpCode INT 200-599,
             @SmtpText NVARCHAR(4000); @DryRun BIT = 0 (the worker sent nothing)
Result set:  one row per mail: ID, Status ('Sent'), NextAttemptUtc (NULL).
Errors:      50131, 50136, 50137, 50201-50203 (mailq.LockLeasedMail); 50147 @SmtpCode.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (the fence reads with UPDLOCK).
Lock order:  mailq.MailQueue (via LockLeasedMail), mailq.MailAttempt, mailq.MailEvent.
Example:     EXEC mailq.MarkSent @IDList = N'[101,102]', @LockToken = @T, @SmtpCode = 250;
*/
CREATE OR ALTER PROCEDURE mailq.MarkSent
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @SmtpCode INT = NULL,
    @SmtpText NVARCHAR(4000) = NULL,
    @DryRun BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @DryRun = COALESCE(@DryRun, 0);
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Acked TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AttemptNo INT NOT NULL,
        AppName NVARCHAR(128) NULL,
        DryRun BIT NOT NULL,
        Enforced BIT NOT NULL  -- claimed as dry-run, acknowledged as a real send
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.LockLeasedMail
            @ID = @ID, @IDList = @IDList, @LockToken = @LockToken, @AcceptSentByToken = 1;
        UPDATE q
        SET
            q.Status = N'Sent',
            q.ThreadLock = NULL,
            q.SentAtUtc = @Now,
            q.DateProcessed = @Now,
            -- The claim's stamp wins: a dry-run application's mail stays DryRun.
            q.DryRun = IIF(@DryRun = 1 OR q.DryRun = 1, CAST(1 AS BIT), CAST(0 AS BIT)),
            q.LastError = NULL
        OUTPUT
            inserted.ID,
            inserted.AttemptCount,
            inserted.AppName,
            inserted.DryRun,
            IIF(deleted.DryRun = 1 AND @DryRun = 0, CAST(1 AS BIT), CAST(0 AS BIT))
        INTO @Acked (ID, AttemptNo, AppName, DryRun, Enforced)
        FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
        INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
        WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken;
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = IIF(a.DryRun = 1, N'DryRun', N'Sent'),
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @SmtpText
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;
        -- One event per mail changed (docs/events.md); a repeat changes no row, writes none.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT
            a.ID, a.AppName, IIF(a.DryRun = 1, N'DryRun', N'Sent'), N'Sent', a.AttemptNo, @SmtpCode,
            IIF(
                a.Enforced = 1,
                LEFT(CONCAT(
                    N'Recorded as DryRun: application ''', a.AppName,
                    N''' is in dry-run (claimed with DryRun = 1) but the worker reported a real send. ',
                    @SmtpText
                ), 4000),
                @SmtpText
            ),
            @Now
        FROM @Acked AS a;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        l.ID,
        N'Sent' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc
    FROM mailq.ParseIDList(@ID, @IDList) AS l
    ORDER BY l.ID;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MarkFailed: records a failed attempt; fenced by the lock token, all or
nothing.  @Disposition (docs/smtp-classification.md):
  Retry  the attempt is spent; UnSent again after @RetryAfterSeconds, or 30 s *
         2^(attempt-1) (at most 1 hour) times 0.8-1.2; Failed when none is left.
  Wait   throttled: the attempt is refunded, UnSent again after @RetryAfterSeconds
         (default 60), the account blocked until then.
  Stop   permanent: Failed at once.
Parameters:  @ID BIGINT or @IDList NVARCHAR(MAX) (JSON array): exactly one;
             @LockToken UNIQUEIDENTIFIER, @Disposition NVARCHAR(8), @Error
             NVARCHAR(4000), required; @RetryAfterSeconds INT 0-604800, @SmtpCode INT 200-599;
             @PossibleDuplicate BIT, default 0: 1 when the server may have the mail (no reply
             after the final dot): the mails keep PossibleDuplicate = 1 (RequeueMail clears it)
Result set:  one row per mail changed: ID, Status (UnSent or Failed), NextAttemptUtc; a
             repeated call (same @LockToken, attempt already ended) changes and returns none.
Errors:      50131, 50136, 50137, 50201-50203 (mailq.LockLeasedMail); 50133
             @Disposition; 50134 @RetryAfterSeconds; 50139 @Error; 50147 @SmtpCode.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (the fence reads with UPDLOCK).
Lock order:  mailq.MailQueue (LockLeasedMail), MailAttempt, MailEvent, SendingAccount (Wait).
Example:     EXEC mailq.MarkFailed @ID = 101, @LockToken = @T, @Disposition = N'Retry',
                 @Error = N'451 4.3.0 try again later', @SmtpCode = 451;
*/
CREATE OR ALTER PROCEDURE mailq.MarkFailed
    @ID BIGINT = NULL,
    @IDList NVARCHAR(MAX) = NULL,
    @LockToken UNIQUEIDENTIFIER,
    @Disposition NVARCHAR(20),
    @Error NVARCHAR(4000),
    @RetryAfterSeconds INT = NULL,
    @SmtpCode INT = NULL,
    @PossibleDuplicate BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @Disposition IS NULL OR @Disposition NOT IN (N'Retry', N'Wait', N'Stop')
    BEGIN
        SET @Msg = CONCAT(N'@Disposition must be Retry, Wait or Stop; got ''', @Disposition, N'''.');
        THROW 50133, @Msg, 1;
    END;
    IF NULLIF(LTRIM(RTRIM(@Error)), N'') IS NULL
        THROW 50139, N'@Error is required: say what failed (the SMTP reply or the exception).', 1;
    IF @RetryAfterSeconds NOT BETWEEN 0 AND 604800
    BEGIN
        SET @Msg = CONCAT(N'@RetryAfterSeconds must be 0-604800 (7 days); got ', @RetryAfterSeconds, N'.');
        THROW 50134, @Msg, 1;
    END;
    IF @SmtpCode NOT BETWEEN 200 AND 599
    BEGIN
        SET @Msg = CONCAT(N'@SmtpCode must be an SMTP reply code 200-599; got ', @SmtpCode, N'.');
        THROW 50147, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @WaitUntil DATETIME2(3) = DATEADD(SECOND, COALESCE(@RetryAfterSeconds, 60), @Now);
    DECLARE @Acked TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        AttemptNo INT NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        AppName NVARCHAR(128) NULL,
        Status NVARCHAR(16) NOT NULL,
        NextAttemptUtc DATETIME2(3) NULL
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.LockLeasedMail
            @ID = @ID, @IDList = @IDList, @LockToken = @LockToken, @AcceptFailedByToken = 1;
        WITH Outcome AS (
            SELECT
                q.ID,
                q.AccountName,
                q.AppName,
                q.Status,
                q.ThreadLock,
                q.VisibleAtUtc,
                q.AttemptsRemaining,
                q.AttemptCount,
                q.DateProcessed,
                q.LastError,
                q.PossibleDuplicate,
                CASE
                    WHEN @Disposition = N'Wait' THEN N'UnSent'
                    WHEN @Disposition = N'Retry' AND q.AttemptsRemaining > 0 THEN N'UnSent'
                    ELSE N'Failed'
                END AS NewStatus,
                CASE
                    WHEN @Disposition = N'Wait' THEN @WaitUntil
                    WHEN @RetryAfterSeconds IS NOT NULL THEN DATEADD(SECOND, @RetryAfterSeconds, @Now)
                    -- Exponential backoff with jitter; NEWID() gives each row its own.
                    ELSE DATEADD(
                        MILLISECOND,
                        CAST(
                            IIF(
                                q.AttemptCount >= 8, 3600,
                                30 * POWER(2, IIF(q.AttemptCount < 1, 0, q.AttemptCount - 1))
                            )
                            -- modulo before ABS: ABS(-2147483648) would overflow
                            * (800 + ABS(CHECKSUM(NEWID()) % 401)) AS INT
                        ),
                        @Now
                    )
                END AS RetryAtUtc
            FROM mailq.MailQueue AS q WITH (FORCESEEK)  -- by ID: a scan would wait on other workers' rows
            INNER JOIN mailq.ParseIDList(@ID, @IDList) AS l ON q.ID = l.ID
            WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken
        )

        UPDATE o
        SET
            o.Status = o.NewStatus,
            o.ThreadLock = NULL,
            o.VisibleAtUtc = IIF(o.NewStatus = N'UnSent', o.RetryAtUtc, o.VisibleAtUtc),
            -- Wait is not the mail's fault: its attempt is refunded.
            o.AttemptsRemaining = o.AttemptsRemaining + IIF(@Disposition = N'Wait', 1, 0),
            o.DateProcessed = @Now,
            o.LastError = @Error,
            o.PossibleDuplicate = IIF(@PossibleDuplicate = 1, CAST(1 AS BIT), o.PossibleDuplicate)
        OUTPUT
            inserted.ID,
            inserted.AttemptCount,
            inserted.AccountName,
            inserted.AppName,
            inserted.Status,
            IIF(inserted.Status = N'UnSent', inserted.VisibleAtUtc, NULL)
        INTO @Acked (ID, AttemptNo, AccountName, AppName, Status, NextAttemptUtc)
        FROM Outcome AS o;
        UPDATE t
        SET
            t.EndedAtUtc = @Now,
            t.Outcome = @Disposition,
            t.SmtpCode = @SmtpCode,
            t.ErrorText = @Error
        FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)  -- seek our attempts only
        INNER JOIN @Acked AS a ON t.MailID = a.ID AND t.AttemptNo = a.AttemptNo;
        -- One event per mail (docs/events.md): AccountWaiting, RetryScheduled or Failed.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT
            a.ID,
            a.AppName,
            CASE
                WHEN @Disposition = N'Wait' THEN N'AccountWaiting'
                WHEN a.Status = N'UnSent' THEN N'RetryScheduled'
                ELSE N'Failed'
            END,
            a.Status,
            a.AttemptNo,
            @SmtpCode,
            @Error,
            @Now
        FROM @Acked AS a;
        IF @Disposition = N'Wait'
            UPDATE s
            SET
                s.BlockedUntilUtc = IIF(s.BlockedUntilUtc > @WaitUntil, s.BlockedUntilUtc, @WaitUntil),
                s.BlockReason = @Error
            FROM mailq.SendingAccount AS s
            WHERE s.AccountName IN (SELECT a.AccountName FROM @Acked AS a);
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        a.ID,
        a.Status,
        a.NextAttemptUtc
    FROM @Acked AS a
    ORDER BY a.ID;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.CancelMail: cancels an UnSent mail (a Sending one may already be at the SMTP server).
Parameters:  @ID BIGINT, required.  Result set: one row: ID, Status ('Cancelled'), NextAttemptUtc (NULL).
Errors:      50136 @ID missing; 50201 unknown mail; 50204 the mail is not UnSent.
Transaction: its own if none is open, else the caller's; an error dooms it (XACT_ABORT ON).
Isolation:   sets READ COMMITTED (UPDLOCK check-then-update).  Lock order: mailq.MailQueue, mailq.MailEvent.
Example:     EXEC mailq.CancelMail @ID = 101;
*/
CREATE OR ALTER PROCEDURE mailq.CancelMail
    @ID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50136, N'@ID is required.', 1;
    DECLARE @Status NVARCHAR(16);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        SELECT @Status = q.Status
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @ID;
        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status <> N'UnSent'
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' is ', @Status, N'; only an UnSent mail can be cancelled.');
            THROW 50204, @Msg, 1;
        END;
        UPDATE q
        SET
            q.Status = N'Cancelled',
            q.DateProcessed = SYSUTCDATETIME()
        OUTPUT
            inserted.ID, inserted.AppName, N'Cancelled', inserted.Status, inserted.AttemptCount,
            NULL, NULL, inserted.DateProcessed
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        @ID AS ID,
        N'Cancelled' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RequeueMail: puts a Failed, Cancelled, Expired or Stopped mail back in the
queue (UnSent) with fresh attempts; PossibleDuplicate and the attempt history are
kept.  An expiry not after the new due time is cleared.
Parameters:  @ID BIGINT, required; @MaxAttempts INT 1-20 = 5; @DateToProcess UTC = now
Result set:  one row: ID, Status ('UnSent'), NextAttemptUtc.
Errors:      50136 @ID missing; 50119 @MaxAttempts out of range; 50201 unknown mail; 50205 not
             Failed, Cancelled, Expired or Stopped; 50600 every recipient is suppressed (others: left out).
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK check-then-update).
Lock order:  mailq.Suppression (key ranges, held: docs/bounces.md), mailq.MailQueue (the
             clustered row), then mailq.MailEvent (insert).
Example:     EXEC mailq.RequeueMail @ID = 101, @MaxAttempts = 3;
*/
CREATE OR ALTER PROCEDURE mailq.RequeueMail
    @ID BIGINT,
    @MaxAttempts INT = 5,
    @DateToProcess DATETIME2(3) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50136, N'@ID is required.', 1;
    SET @MaxAttempts = COALESCE(@MaxAttempts, 5);
    IF @MaxAttempts NOT BETWEEN 1 AND 20
    BEGIN
        SET @Msg = CONCAT(N'@MaxAttempts must be 1-20; got ', @MaxAttempts, N'.');
        THROW 50119, @Msg, 1;
    END;
    SET @DateToProcess = COALESCE(@DateToProcess, SYSUTCDATETIME());
    DECLARE @Status NVARCHAR(16), @To NVARCHAR(MAX), @CC NVARCHAR(MAX), @BCC NVARCHAR(MAX), @Left INT,
        @Suppressed NVARCHAR(MAX);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- Addresses suppressed since the mail was queued (the sweep passes finished mail by): left out as at
        -- enqueue.  Read before the row lock, in the suppression lock order; a finished mail's lists never change.
        SELECT @To = f.ToAddress, @CC = f.CC, @BCC = f.BCC, @Left = f.EntriesLeft, @Suppressed = f.Suppressed
        FROM mailq.MailQueue AS q
        CROSS APPLY mailq.FilterSuppressedRecipients(q.AccountName, q.AppName, q.ToAddress, q.CC, q.BCC) AS f
        WHERE q.ID = @ID;
        -- UPDLOCK: check and change under one lock.
        SELECT @Status = q.Status
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @ID;
        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @ID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status NOT IN (N'Failed', N'Cancelled', N'Expired', N'Stopped')
        BEGIN
            SET @Msg = CONCAT(
                N'Mail ', @ID, N' is ', @Status, N'; only Failed, Cancelled, Expired or Stopped mail can be requeued.'
            );
            THROW 50205, @Msg, 1;
        END;
        IF @Left = 0
        BEGIN
            SET @Msg = LEFT(CONCAT(N'Mail ', @ID, N': every recipient is suppressed (mailq.RemoveSuppression first): ',
                @Suppressed), 2048);
            THROW 50600, @Msg, 1;
        END;
        UPDATE q
        SET
            q.Status = N'UnSent',
            q.DateToProcess = @DateToProcess,
            q.VisibleAtUtc = @DateToProcess,
            q.AttemptsRemaining = @MaxAttempts,
            q.ExpiresAtUtc = IIF(q.ExpiresAtUtc > @DateToProcess, q.ExpiresAtUtc, NULL),
            q.DateProcessed = NULL,
            q.ToAddress = IIF(@Suppressed IS NULL, q.ToAddress, ISNULL(@To, N'')),
            q.CC = IIF(@Suppressed IS NULL, q.CC, @CC),
            q.BCC = IIF(@Suppressed IS NULL, q.BCC, @BCC)
        -- The Requeued event in the same statement (docs/events.md).
        OUTPUT
            inserted.ID, inserted.AppName, N'Requeued', inserted.Status, inserted.AttemptCount,
            NULL, NULL, SYSUTCDATETIME()
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT q.ID, q.AppName, N'RecipientSuppressed', q.Status, q.AttemptCount, NULL,
            LEFT(CONCAT(N'not sent to (suppressed): ', @Suppressed), 4000), SYSUTCDATETIME()
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID AND @Suppressed IS NOT NULL;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        @ID AS ID,
        N'UnSent' AS Status,
        @DateToProcess AS NextAttemptUtc;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.PurgeMail: deletes final mail (Sent, Failed, Cancelled, Expired, Stopped)
processed more than @OlderThanDays days ago, with its attempts, attachments,
recipient outcomes, events and mailq.DbMailItem (cascade), @BatchSize mails per
transaction; rows others hold are skipped (READPAST).  At most 1,000 rows per
statement and index, by forced seeks (docs/dba-guide.md).
Parameters:  @OlderThanDays INT 0-36500, required; @BatchSize INT 1-1000 = 500
Result set:  one row: PurgedCount BIGINT
Errors:      50135 @OlderThanDays missing or negative; 50163 over 36500 (the cutoff
             would underflow, 517); 50140 @BatchSize out of range; 50141 in a transaction
Transaction: refuses one (50141); each batch commits on its own, also in implicit
             transaction mode (turned off inside); an error rolls back the batch
             under way (earlier batches stay purged) and is re-raised
Isolation:   READ COMMITTED (READPAST needs READ COMMITTED or REPEATABLE READ, which
             would keep every S lock); candidates read READCOMMITTEDLOCK
Lock order:  mailq.MailQueue rows (U), MailAttempt, MailAttachment,
             MailRecipientOutcome, MailEvent, then the MailQueue rows' deletion
Example:     EXEC mailq.PurgeMail @OlderThanDays = 30;
*/
CREATE OR ALTER PROCEDURE mailq.PurgeMail
    @OlderThanDays INT,
    @BatchSize INT = 500
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- Each BEGIN TRANSACTION must be a real one, not nested in an implicit one.
    SET IMPLICIT_TRANSACTIONS OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @OlderThanDays IS NULL OR @OlderThanDays < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@OlderThanDays must be 0 or more; got ', COALESCE(CAST(@OlderThanDays AS NVARCHAR(12)), N'NULL'), N'.'
        );
        THROW 50135, @Msg, 1;
    END;
    IF @OlderThanDays > 36500
    BEGIN
        SET @Msg = CONCAT(N'@OlderThanDays must be at most 36500 (100 years); got ', @OlderThanDays, N'.');
        THROW 50163, @Msg, 1;
    END;
    SET @BatchSize = COALESCE(@BatchSize, 500);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50140, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50141, N'mailq.PurgeMail commits batch by batch: call it outside a transaction.', 1;
    DECLARE @Cutoff DATETIME2(3) = DATEADD(DAY, -@OlderThanDays, SYSUTCDATETIME());
    DECLARE @Purged BIGINT = 0;
    DECLARE @Candidate TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Batch TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Deleted INT;
    WHILE 1 = 1
    BEGIN
        DELETE FROM @Candidate;
        DELETE FROM @Batch;
        BEGIN TRY
            BEGIN TRANSACTION;
            -- 1. Candidates: covering range seek on IX_MailQueue_Final, oldest first, never
            --    a scan.  READCOMMITTEDLOCK, READPAST, ROWLOCK: S locks released row by row,
            --    rows others hold skipped.
            INSERT INTO @Candidate (ID)
            SELECT TOP (@BatchSize) q.ID
            FROM mailq.MailQueue AS q WITH (
                INDEX (IX_MailQueue_Final), FORCESEEK, READCOMMITTEDLOCK, READPAST, ROWLOCK
            )
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
                AND q.DateProcessed < @Cutoff
            ORDER BY q.DateProcessed ASC, q.ID ASC;
            IF @@ROWCOUNT = 0
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;
            -- 2. Lock the batch on the clustered index and re-check (a candidate may have
            --    been requeued); FORCESEEK keeps the plan off IX_MailQueue_Final.
            INSERT INTO @Batch (ID)
            SELECT q.ID
            FROM @Candidate AS c
            INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)), UPDLOCK, READPAST, ROWLOCK)
                ON c.ID = q.ID
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
                AND q.DateProcessed < @Cutoff;
            -- All taken or changed meanwhile: stop rather than spin.
            IF NOT EXISTS (SELECT 1 FROM @Batch)
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;
            -- 3. Children, 1000 rows per statement.  FORCESEEK: a seek per mail, never a
            --    scan that would wait on the rows of live mail.
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) t
                FROM mailq.MailAttempt AS t WITH (FORCESEEK (PK_MailAttempt (MailID)), ROWLOCK)
                WHERE t.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) a
                FROM mailq.MailAttachment AS a WITH (FORCESEEK (PK_MailAttachment (MailID)), ROWLOCK)
                WHERE a.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;
            -- Outcomes here, not by the parent's ON DELETE CASCADE: that one statement
            -- would lock up to 100 x @BatchSize rows and escalate past 5,000.
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) o
                FROM mailq.MailRecipientOutcome AS o WITH (FORCESEEK (PK_MailRecipientOutcome (MailID)), ROWLOCK)
                WHERE o.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;
            -- Events: a seek per mail on IX_MailEvent_MailID, 1000 rows per statement.
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) e
                FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_MailID), FORCESEEK, ROWLOCK)
                WHERE e.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;
            -- 4. The mails themselves (rows already held since step 2), by key.
            DELETE q
            FROM mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)), ROWLOCK)
            WHERE q.ID IN (SELECT b.ID FROM @Batch AS b);
            SET @Purged += @@ROWCOUNT;
            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;
    END;
    SELECT @Purged AS PurgedCount;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.UpsertSendingAccount: creates a sending account (and its rate budget row)
or changes only the settings it is given (SMTP settings live in the worker's config).
Parameters:  @AccountName NVARCHAR(128), required
             @DefaultFromAddress NVARCHAR(320): one bare address; required to create
             @DefaultFromName NVARCHAR(200); @PerMinuteLimit, @PerHourLimit,
             @PerDayLimit INT > 0; @MinLoginIntervalMs INT 1-86,400,000
             @IsDefault BIT: 1 = the account EnqueueMail uses without @AccountName
             (replaces the previous one); 0 = no longer the default
             NULL keeps what is stored; @Clear NVARCHAR(4000): comma-separated
             settings to remove (DefaultFromName, PerMinuteLimit, PerHourLimit,
             PerDayLimit, MinLoginIntervalMs)
Result set:  none.
Errors:      50142 @AccountName missing; 50103 a value over its size; 50105 CR/LF
             in @DefaultFromName; 50102 @DefaultFromAddress invalid; 50143 a limit
             not positive; 50122 @MinLoginIntervalMs out of range; 50503 a new
             account without @DefaultFromAddress; 50504 @Clear names another
             setting, or one also given a value.  Nothing is written.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED and the SET options of filtered-index DML, set here.
Lock order:  mailq.SendingAccount (row, then previous default), mailq.RateBudget.
Example:     EXEC mailq.UpsertSendingAccount @AccountName = N'qq', @PerMinuteLimit = 30;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertSendingAccount
    @AccountName NVARCHAR(4000),
    @DefaultFromAddress NVARCHAR(4000) = NULL,
    @DefaultFromName NVARCHAR(4000) = NULL,
    @PerMinuteLimit INT = NULL,
    @PerHourLimit INT = NULL,
    @PerDayLimit INT = NULL,
    @IsDefault BIT = NULL,
    @MinLoginIntervalMs INT = NULL,
    @Clear NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET ANSI_WARNINGS, ANSI_PADDING, CONCAT_NULL_YIELDS_NULL ON;   -- filtered-index DML (else 1934)
    SET NUMERIC_ROUNDABORT OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;
    IF LEN(@AccountName) > 128 OR LEN(@DefaultFromAddress) > 320 OR LEN(@DefaultFromName) > 200
        THROW 50103, N'@AccountName (128), @DefaultFromAddress (320) or @DefaultFromName (200) is over its size.', 1;
    IF @DefaultFromName COLLATE Latin1_General_100_BIN2 LIKE N'%[' + NCHAR(13) + NCHAR(10) + N']%'
        THROW 50105, N'@DefaultFromName contains CR or LF (header injection is refused).', 1;
    IF
        @DefaultFromAddress IS NOT NULL AND (
            (SELECT COUNT(*) FROM mailq.ParseAddressList(@DefaultFromAddress)) <> 1
            OR EXISTS (
                SELECT 1
                FROM mailq.ParseAddressList(@DefaultFromAddress) AS a
                WHERE a.Problem IS NOT NULL OR a.DisplayName IS NOT NULL
            )
        )
    BEGIN
        SET @Msg = CONCAT(
            N'@DefaultFromAddress must be one valid address; got ''', LEFT(@DefaultFromAddress, 100), N'''.'
        );
        THROW 50102, @Msg, 1;
    END;
    IF @PerMinuteLimit <= 0 OR @PerHourLimit <= 0 OR @PerDayLimit <= 0
        THROW 50143, N'@PerMinuteLimit, @PerHourLimit and @PerDayLimit must be positive (@Clear removes a limit).', 1;
    IF @MinLoginIntervalMs NOT BETWEEN 1 AND 86400000
    BEGIN
        SET @Msg = CONCAT(
            N'@MinLoginIntervalMs must be 1-86400000 milliseconds (24 hours; @Clear removes it); got ',
            @MinLoginIntervalMs, N'.'
        );
        THROW 50122, @Msg, 1;
    END;
    -- @Clear: each name once, known, and not also given a value.
    DECLARE @Cleared TABLE (Setting NVARCHAR(128) NOT NULL PRIMARY KEY, Given BIT NULL);
    INSERT INTO @Cleared (Setting, Given)
    SELECT DISTINCT s.Setting, v.Given
    FROM STRING_SPLIT(@Clear, N',') AS c
    CROSS APPLY (VALUES (LEFT(LTRIM(RTRIM(c.value)), 128))) AS s(Setting)
    LEFT JOIN (
        VALUES
        (N'DefaultFromName', IIF(@DefaultFromName IS NULL, 0, 1)),
        (N'PerMinuteLimit', IIF(@PerMinuteLimit IS NULL, 0, 1)),
        (N'PerHourLimit', IIF(@PerHourLimit IS NULL, 0, 1)),
        (N'PerDayLimit', IIF(@PerDayLimit IS NULL, 0, 1)),
        (N'MinLoginIntervalMs', IIF(@MinLoginIntervalMs IS NULL, 0, 1))
    ) AS v(Setting, Given) ON s.Setting = v.Setting
    WHERE s.Setting <> N'';
    SELECT TOP (1) @Msg = CONCAT(N'@Clear: ''', LEFT(c.Setting, 100), IIF(c.Given IS NULL,
        N''' is not a setting that can be removed (DefaultFromName, PerMinuteLimit, PerHourLimit, PerDayLimit, '
        + N'MinLoginIntervalMs).', N''' is also given a value: give a value or remove it, not both.'))
    FROM @Cleared AS c
    WHERE c.Given IS NULL OR c.Given = 1;
    IF @Msg IS NOT NULL THROW 50504, @Msg, 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race (a small admin table).
        DECLARE @Exists BIT = IIF(EXISTS (
            SELECT 1 FROM mailq.SendingAccount AS a WITH (UPDLOCK, HOLDLOCK) WHERE a.AccountName = @AccountName
        ), 1, 0);
        IF @Exists = 0 AND @DefaultFromAddress IS NULL
        BEGIN
            SET @Msg = CONCAT(
                N'@DefaultFromAddress is required to create sending account ''', LEFT(@AccountName, 128), N'''.'
            );
            THROW 50503, @Msg, 1;
        END;
        -- One default at most: the previous one stops being it first.
        IF @IsDefault = 1
            UPDATE a
            SET a.IsDefault = 0
            FROM mailq.SendingAccount AS a
            WHERE a.IsDefault = 1 AND a.AccountName <> @AccountName;
        IF @Exists = 1
            UPDATE a
            SET
                a.DefaultFromAddress = COALESCE(LTRIM(RTRIM(@DefaultFromAddress)), a.DefaultFromAddress),
                a.DefaultFromName = IIF(c.Name = 1, NULL, COALESCE(@DefaultFromName, a.DefaultFromName)),
                a.PerMinuteLimit = IIF(c.Minute = 1, NULL, COALESCE(@PerMinuteLimit, a.PerMinuteLimit)),
                a.PerHourLimit = IIF(c.Hour = 1, NULL, COALESCE(@PerHourLimit, a.PerHourLimit)),
                a.PerDayLimit = IIF(c.Day = 1, NULL, COALESCE(@PerDayLimit, a.PerDayLimit)),
                a.IsDefault = COALESCE(@IsDefault, a.IsDefault),
                a.MinLoginIntervalMs = IIF(c.Login = 1, NULL, COALESCE(@MinLoginIntervalMs, a.MinLoginIntervalMs))
            FROM mailq.SendingAccount AS a
            CROSS APPLY (
                SELECT
                    MAX(IIF(k.Setting = N'DefaultFromName', 1, 0)) AS Name,
                    MAX(IIF(k.Setting = N'PerMinuteLimit', 1, 0)) AS Minute,
                    MAX(IIF(k.Setting = N'PerHourLimit', 1, 0)) AS Hour,
                    MAX(IIF(k.Setting = N'PerDayLimit', 1, 0)) AS Day,
                    MAX(IIF(k.Setting = N'MinLoginIntervalMs', 1, 0)) AS Login
                FROM @Cleared AS k
            ) AS c
            WHERE a.AccountName = @AccountName;
        ELSE
            INSERT INTO mailq.SendingAccount (
                AccountName, DefaultFromAddress, DefaultFromName,
                PerMinuteLimit, PerHourLimit, PerDayLimit, IsDefault, MinLoginIntervalMs
            )
            VALUES (
                @AccountName, LTRIM(RTRIM(@DefaultFromAddress)), @DefaultFromName,
                @PerMinuteLimit, @PerHourLimit, @PerDayLimit, COALESCE(@IsDefault, 0), @MinLoginIntervalMs
            );
        IF NOT EXISTS (SELECT 1 FROM mailq.RateBudget AS b WHERE b.AccountName = @AccountName)
            INSERT INTO mailq.RateBudget (AccountName) VALUES (@AccountName);
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.UnblockSendingAccount: clears an account's BlockedUntilUtc (set by MarkFailed
'Wait') and makes the mails a Wait deferred visible now (never before their own
DateToProcess); mail scheduled later or in Retry backoff keeps its time.
Parameters:  @AccountName NVARCHAR(128), required.
Result set:  one row: AccountName, MadeVisibleCount INT.
Errors:      50142 @AccountName missing; 50114 unknown account.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here; the attempt read is READCOMMITTEDLOCK.
Lock order:  mailq.MailQueue, reading mailq.MailAttempt, then mailq.SendingAccount
             (MarkFailed's order: an unblock and a Wait never deadlock).
Example:     EXEC mailq.UnblockSendingAccount @AccountName = N'qq';
*/
CREATE OR ALTER PROCEDURE mailq.UnblockSendingAccount
    @AccountName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50142, N'@AccountName is required.', 1;
    IF NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @AccountName)
    BEGIN
        SET @Msg = CONCAT(N'@AccountName ''', LEFT(@AccountName, 128), N''' is not a sending account.');
        THROW 50114, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Visible INT = 0;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- ROWLOCK: row grain on the account's deferred mails only.
        UPDATE q
        SET q.VisibleAtUtc = IIF(q.DateToProcess > @Now, q.DateToProcess, @Now)
        FROM mailq.MailQueue AS q WITH (ROWLOCK)
        WHERE
            q.AccountName = @AccountName
            AND q.Status = N'UnSent'
            AND q.VisibleAtUtc > @Now
            AND EXISTS (
                SELECT 1
                FROM mailq.MailAttempt AS t WITH (READCOMMITTEDLOCK)
                WHERE t.MailID = q.ID AND t.AttemptNo = q.AttemptCount AND t.Outcome = N'Wait'
            );
        SET @Visible = @@ROWCOUNT;
        UPDATE a
        SET
            a.BlockedUntilUtc = NULL,
            a.BlockReason = NULL
        FROM mailq.SendingAccount AS a
        WHERE a.AccountName = @AccountName;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        CAST(@AccountName AS NVARCHAR(128)) AS AccountName,
        @Visible AS MadeVisibleCount;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.AcquireLoginSlot: grants a worker's SMTP login to an account (stamping LastLoginAtUtc) or
says how long to wait, so logins on one account stay MinLoginIntervalMs apart across all workers.
Parameters:  @AccountName NVARCHAR(128), required: an existing sending account.
Result set:  one row: Granted BIT, WaitMs INT (0 when granted), MinLoginIntervalMs, LastLoginAtUtc.
Errors:      50123 @AccountName missing; 50103 over 128 characters; 50270 no such account.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED;
             one UPDATE by key (U-locked, also under RCSI) decides and stamps: never two grants.
Lock order:  mailq.SendingAccount only (one row).  Example: EXEC mailq.AcquireLoginSlot @AccountName = N'qq';
*/
CREATE OR ALTER PROCEDURE mailq.AcquireLoginSlot
    @AccountName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50123, N'@AccountName is required: the sending account the worker is about to log in to.', 1;
    IF LEN(@AccountName) > 128
        THROW 50103, N'@AccountName is over its size (128).', 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Slot TABLE (
        MinLoginIntervalMs INT NULL,
        PreviousLoginAtUtc DATETIME2(3) NULL,
        LastLoginAtUtc DATETIME2(3) NULL
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- Granted also when the stamp lies more than one interval ahead (the clock went back).
        UPDATE a
        SET a.LastLoginAtUtc = IIF(
            a.MinLoginIntervalMs IS NULL
            OR a.LastLoginAtUtc IS NULL
            OR a.LastLoginAtUtc <= DATEADD(MILLISECOND, -a.MinLoginIntervalMs, @Now)
            OR a.LastLoginAtUtc > DATEADD(MILLISECOND, a.MinLoginIntervalMs, @Now),
            @Now,
            a.LastLoginAtUtc
        )
        OUTPUT inserted.MinLoginIntervalMs, deleted.LastLoginAtUtc, inserted.LastLoginAtUtc
        INTO @Slot (MinLoginIntervalMs, PreviousLoginAtUtc, LastLoginAtUtc)
        FROM mailq.SendingAccount AS a
        WHERE a.AccountName = @AccountName;
        IF NOT EXISTS (SELECT 1 FROM @Slot)
        BEGIN
            SET @Msg = CONCAT(
                N'@AccountName ''', LEFT(@AccountName, 128),
                N''' is not a sending account (create it with mailq.UpsertSendingAccount).'
            );
            THROW 50270, @Msg, 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    -- DATEDIFF_BIG: a stamp far from @Now must not overflow INT before the cap.
    WITH Decided AS (
        SELECT
            s.MinLoginIntervalMs,
            s.LastLoginAtUtc,
            CAST(IIF(
                s.MinLoginIntervalMs IS NULL
                OR s.PreviousLoginAtUtc IS NULL
                OR s.PreviousLoginAtUtc <= DATEADD(MILLISECOND, -s.MinLoginIntervalMs, @Now)
                OR s.PreviousLoginAtUtc > DATEADD(MILLISECOND, s.MinLoginIntervalMs, @Now),
                1, 0
            ) AS BIT) AS Granted,
            DATEDIFF_BIG(
                MILLISECOND, @Now, DATEADD(MILLISECOND, s.MinLoginIntervalMs, s.PreviousLoginAtUtc)
            ) AS LeftMs
        FROM @Slot AS s
    )

    SELECT
        d.Granted,
        CAST(IIF(
            d.Granted = 1, 0,
            IIF(d.LeftMs > d.MinLoginIntervalMs, d.MinLoginIntervalMs, IIF(d.LeftMs < 1, 1, d.LeftMs))
        ) AS INT) AS WaitMs,
        d.MinLoginIntervalMs,
        d.LastLoginAtUtc
    FROM Decided AS d;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.UpsertApplication: registers an application name that mails may carry and
isolated workers may claim by, or changes it.  A new application is bound to
nothing: mailq.BindApplication first, else EnqueueMail refuses (50160/50161).
Parameters:  @AppName NVARCHAR(128), required; @Description NVARCHAR(400)
             @DryRun BIT: 1 = its mails go the whole path but are recorded as
             DryRun, reaching no server; 0 = sent; NULL = unchanged (0 when new);
             takes effect at each mail's next claim
Result set:  none.
Errors:      50145 @AppName missing; 50103 a value over its size.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK, HOLDLOCK insert-if-absent).
Lock order:  mailq.Application only.
Example:     EXEC mailq.UpsertApplication @AppName = N'billing', @Description = N'Invoices';
*/
CREATE OR ALTER PROCEDURE mailq.UpsertApplication
    @AppName NVARCHAR(4000),
    @Description NVARCHAR(4000) = NULL,
    @DryRun BIT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF NULLIF(LTRIM(RTRIM(@AppName)), N'') IS NULL
        THROW 50145, N'@AppName is required.', 1;
    IF LEN(@AppName) > 128 OR LEN(@Description) > 400
        THROW 50103, N'@AppName (128) or @Description (400) is over its size.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race between two callers.
        IF EXISTS (SELECT 1 FROM mailq.Application AS p WITH (UPDLOCK, HOLDLOCK) WHERE p.AppName = @AppName)
            UPDATE p
            SET
                p.Description = @Description,
                p.DryRun = COALESCE(@DryRun, p.DryRun)
            FROM mailq.Application AS p
            WHERE p.AppName = @AppName;
        ELSE
            INSERT INTO mailq.Application (AppName, Description, DryRun)
            VALUES (@AppName, @Description, COALESCE(@DryRun, CAST(0 AS BIT)));
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.BindApplication: lets an application send through an account and/or as a From address or
'@domain', and/or maps a database user to it (a user mapped elsewhere moves); idempotent.
Parameters:  @AppName, required; at least one of @AccountName, @FromAddress (one bare address or
             '@example.com', stored lower case) and @PrincipalName (a user whose mail carries @AppName).
Errors:      50145 @AppName missing; 50115 unknown application; 50114 unknown account; 50164
             nothing to bind; 50165 bad @FromAddress; 50169 @PrincipalName is not a user.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.ApplicationAccount, mailq.ApplicationFrom, mailq.ApplicationPrincipal.
Example:     EXEC mailq.BindApplication @AppName = N'billing', @FromAddress = N'@billing.example.com';
*/
CREATE OR ALTER PROCEDURE mailq.BindApplication
    @AppName NVARCHAR(4000),
    @AccountName NVARCHAR(4000) = NULL,
    @FromAddress NVARCHAR(4000) = NULL,
    @PrincipalName NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@AppName)), N'') IS NULL
        THROW 50145, N'@AppName is required.', 1;
    IF @AccountName IS NULL AND @FromAddress IS NULL AND @PrincipalName IS NULL
        THROW 50164, N'Give @AccountName, @FromAddress and/or @PrincipalName: what to bind.', 1;
    IF NOT EXISTS (SELECT 1 FROM mailq.Application AS p WHERE p.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(
            N'@AppName ''', LEFT(@AppName, 128), N''' is not a registered application (mailq.UpsertApplication).'
        );
        THROW 50115, @Msg, 1;
    END;
    IF
        @AccountName IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @AccountName)
    BEGIN
        SET @Msg = CONCAT(N'@AccountName ''', LEFT(@AccountName, 128), N''' is not a sending account.');
        THROW 50114, @Msg, 1;
    END;
    IF
        @PrincipalName IS NOT NULL
        AND NOT EXISTS (
            SELECT 1
            FROM sys.database_principals AS d
            WHERE d.name = @PrincipalName AND d.type IN ('S', 'U', 'E', 'X', 'C', 'K')  -- users: USER_NAME()
        )
    BEGIN
        SET @Msg = CONCAT(N'@PrincipalName ''', LEFT(@PrincipalName, 128), N''' is not a database user.');
        THROW 50169, @Msg, 1;
    END;
    DECLARE @Pattern NVARCHAR(320);
    IF @FromAddress IS NOT NULL
    BEGIN
        SET @Pattern = LOWER(LTRIM(RTRIM(@FromAddress)));
        DECLARE @Probe NVARCHAR(4000) = IIF(LEFT(@Pattern, 1) = N'@', N'x' + @Pattern, @Pattern);
        IF
            LEN(@FromAddress) > 320
            OR (SELECT COUNT(*) FROM mailq.ParseAddressList(@Probe)) <> 1
            OR EXISTS (
                SELECT 1
                FROM mailq.ParseAddressList(@Probe) AS a
                WHERE a.Problem IS NOT NULL OR a.DisplayName IS NOT NULL
            )
        BEGIN
            SET @Msg = CONCAT(
                N'@FromAddress must be one bare address or a domain written @example.com; got ''',
                LEFT(@FromAddress, 100), N'''.'
            );
            THROW 50165, @Msg, 1;
        END;
    END;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK, HOLDLOCK: admin-only tables; their range locks never meet the enqueue path.
        IF
            @AccountName IS NOT NULL
            AND NOT EXISTS (
                SELECT 1
                FROM mailq.ApplicationAccount AS b WITH (UPDLOCK, HOLDLOCK)
                WHERE b.AppName = @AppName AND b.AccountName = @AccountName
            )
            INSERT INTO mailq.ApplicationAccount (AppName, AccountName)
            VALUES (@AppName, @AccountName);
        IF
            @Pattern IS NOT NULL
            AND NOT EXISTS (
                SELECT 1
                FROM mailq.ApplicationFrom AS f WITH (UPDLOCK, HOLDLOCK)
                WHERE f.AppName = @AppName AND f.FromPattern = @Pattern
            )
            INSERT INTO mailq.ApplicationFrom (AppName, FromPattern)
            VALUES (@AppName, @Pattern);
        IF @PrincipalName IS NOT NULL
        BEGIN
            UPDATE u
            SET u.AppName = @AppName
            FROM mailq.ApplicationPrincipal AS u WITH (UPDLOCK, HOLDLOCK)
            WHERE u.PrincipalName = @PrincipalName;
            IF @@ROWCOUNT = 0
                INSERT INTO mailq.ApplicationPrincipal (PrincipalName, AppName)
                VALUES (@PrincipalName, @AppName);
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.UnbindApplication: withdraws what mailq.BindApplication allowed; queued mail
is not touched, later enqueues are refused.  Unbinding what is not bound is a no-op.
Parameters:  @AppName NVARCHAR(128), required; at least one of:
             @AccountName NVARCHAR(128): the account to withdraw
             @FromAddress NVARCHAR(320): the address or '@domain' (case-insensitive)
             @PrincipalName sysname: the database user to unmap (if mapped to @AppName)
Result set:  none.
Errors:      50145 @AppName missing; 50164 none of the three.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here.
Lock order:  mailq.ApplicationAccount, mailq.ApplicationFrom, mailq.ApplicationPrincipal.
Example:     EXEC mailq.UnbindApplication @AppName = N'billing', @AccountName = N'qq';
*/
CREATE OR ALTER PROCEDURE mailq.UnbindApplication
    @AppName NVARCHAR(4000),
    @AccountName NVARCHAR(4000) = NULL,
    @FromAddress NVARCHAR(4000) = NULL,
    @PrincipalName NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF NULLIF(LTRIM(RTRIM(@AppName)), N'') IS NULL
        THROW 50145, N'@AppName is required.', 1;
    IF @AccountName IS NULL AND @FromAddress IS NULL AND @PrincipalName IS NULL
        THROW 50164, N'Give @AccountName, @FromAddress and/or @PrincipalName: what to withdraw.', 1;
    DECLARE @Pattern NVARCHAR(4000) = LOWER(LTRIM(RTRIM(@FromAddress)));
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        IF @AccountName IS NOT NULL
            DELETE b
            FROM mailq.ApplicationAccount AS b
            WHERE b.AppName = @AppName AND b.AccountName = @AccountName;
        IF @Pattern IS NOT NULL
            DELETE f
            FROM mailq.ApplicationFrom AS f
            WHERE f.AppName = @AppName AND f.FromPattern = @Pattern;
        IF @PrincipalName IS NOT NULL
            DELETE u
            FROM mailq.ApplicationPrincipal AS u
            WHERE u.AppName = @AppName AND u.PrincipalName = @PrincipalName;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.SetEnqueuePolicy: whether a database user no application binding covers
(no mailq.ApplicationPrincipal row) may enqueue.  db_owner and MailqAdmin only: the
procedure checks the caller itself, whatever EXECUTE was granted.
Parameters:  @AllowUnmappedEnqueuers BIT, required: 0 = refuse such a user with
             50500 (a new installation's setting); 1 = the documented opt-in:
             such a user enqueues unbound, through any account as any From address.
Result set:  none.
Errors:      50501 @AllowUnmappedEnqueuers NULL; 50502 the caller is neither a
             member of db_owner nor of MailqAdmin.  Nothing is written.
Transaction: its own or the caller's; an error dooms the caller's (XACT_ABORT ON).
Isolation:   READ COMMITTED, set here.
Lock order:  mailq.EnqueuePolicy only (one row).
Example:     EXEC mailq.SetEnqueuePolicy @AllowUnmappedEnqueuers = 0;
*/
CREATE OR ALTER PROCEDURE mailq.SetEnqueuePolicy
    @AllowUnmappedEnqueuers BIT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF @AllowUnmappedEnqueuers IS NULL
        THROW 50501, N'@AllowUnmappedEnqueuers is required: 0 refuses unmapped enqueuers, 1 allows them.', 1;
    -- IS_ROLEMEMBER checks the caller's own user (this module has no EXECUTE AS).
    IF COALESCE(IS_ROLEMEMBER(N'db_owner'), 0) = 0 AND COALESCE(IS_ROLEMEMBER(N'MailqAdmin'), 0) = 0
        THROW 50502, N'mailq.SetEnqueuePolicy is for members of db_owner or MailqAdmin.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        UPDATE p
        SET
            p.AllowUnmappedEnqueuers = @AllowUnmappedEnqueuers,
            p.ChangedAtUtc = SYSUTCDATETIME(),
            p.ChangedBy = LEFT(ORIGINAL_LOGIN(), 128)
        FROM mailq.EnqueuePolicy AS p
        WHERE p.PolicyId = 1;
        IF @@ROWCOUNT = 0
            INSERT INTO mailq.EnqueuePolicy (PolicyId, AllowUnmappedEnqueuers, ChangedBy)
            VALUES (1, @AllowUnmappedEnqueuers, LEFT(ORIGINAL_LOGIN(), 128));
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetEnqueuePolicy: the enqueue policy in force and the database users who may enqueue
without being mapped to an application (for `mailq-db doctor`); runs with the caller's rights.
Parameters:  none.
Result sets: 1. AllowUnmappedEnqueuers, ChangedAtUtc, ChangedBy, MembershipVisible BIT (0: the
                caller cannot see others' memberships: set 2 is incomplete)
             2. unmapped users, one row per way in: PrincipalName, Via (the grant's holder); Windows
                groups are listed; a DENY is not subtracted.
Errors:      none of its own.  Transaction: reads only.  Isolation: READ COMMITTED, set here.
Lock order:  none (catalog views and mailq.EnqueuePolicy, no locking hint).
Example:     EXEC mailq.GetEnqueuePolicy;
*/
CREATE OR ALTER PROCEDURE mailq.GetEnqueuePolicy
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SELECT
        COALESCE(p.AllowUnmappedEnqueuers, CAST(0 AS BIT)) AS AllowUnmappedEnqueuers,
        p.ChangedAtUtc,
        p.ChangedBy,
        CAST(IIF(
            COALESCE(IS_ROLEMEMBER(N'db_owner'), 0) = 1 OR COALESCE(IS_ROLEMEMBER(N'db_securityadmin'), 0) = 1
            OR HAS_PERMS_BY_NAME(DB_NAME(), N'DATABASE', N'VIEW DEFINITION') = 1, 1, 0
        ) AS BIT) AS MembershipVisible
    FROM (VALUES (1)) AS one(PolicyId)
    LEFT JOIN mailq.EnqueuePolicy AS p ON one.PolicyId = p.PolicyId;
    WITH grantee AS (
        SELECT d.grantee_principal_id AS PrincipalId
        FROM sys.database_permissions AS d
        WHERE
            d.permission_name = N'EXECUTE' AND d.state IN ('G', 'W')
            AND (
                d.class = 0
                OR (d.class = 3 AND d.major_id = SCHEMA_ID(N'mailq'))
                OR (d.class = 1 AND d.major_id IN (
                    OBJECT_ID(N'mailq.EnqueueMail'), OBJECT_ID(N'mailq.EnqueueMailBatch'),
                    OBJECT_ID(N'mailq.SendDbMail')
                ))
            )
        UNION ALL
        SELECT DATABASE_PRINCIPAL_ID(N'db_owner')
        UNION ALL
        SELECT DATABASE_PRINCIPAL_ID(N'dbo')
    ),

holder AS (
        SELECT g.PrincipalId, g.PrincipalId AS ViaId FROM grantee AS g
        UNION ALL
        SELECT m.member_principal_id, h.ViaId
        FROM holder AS h
        INNER JOIN sys.database_role_members AS m ON h.PrincipalId = m.role_principal_id
    )

    SELECT DISTINCT u.name AS PrincipalName, USER_NAME(h.ViaId) AS Via
    FROM holder AS h
    INNER JOIN sys.database_principals AS u ON h.PrincipalId = u.principal_id OR h.PrincipalId = 0
    WHERE
        -- users, not roles (EnqueueMail compares USER_NAME()); G: a Windows group
        u.type IN ('S', 'U', 'G', 'E', 'X', 'C', 'K')
        AND u.principal_id NOT IN (2, 3, 4)         -- guest, INFORMATION_SCHEMA, sys; dbo is listed
        AND u.name NOT IN (SELECT a.PrincipalName FROM mailq.ApplicationPrincipal AS a)
    ORDER BY u.name, USER_NAME(h.ViaId);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetQueueStats: the queue's health in one call (`mailq-db stats`), by forced
seeks bounded by queued mail or a time window, never by the history kept.
Parameters:  @RecentFailures INT 1-1000 = 20: rows of result set 4;
             @FinishedHours  INT 1-168 = 24: the window of result set 3.
Result sets: 1. Status, AccountName, MailCount: mail queued now (UnSent, Sending)
             2. AccountName, OldestDueUtc, OldestDueAgeSeconds, DueCount: due UnSent
                mail per account
             3. HourUtc, AccountName, Sent, Failed, Expired, Cancelled, Stopped: mail
                finished per UTC hour over the last @FinishedHours hours
             4. ID, AttemptNo, AccountName, Status, Outcome, SmtpCode, LastError,
                DateProcessed: the newest failed attempts of the last 7 days
Errors:      50146 @RecentFailures out of range; 50520 @FinishedHours out of range.
Transaction: reads only; opens none.
Isolation:   READ COMMITTED, set here (no locks kept for a SERIALIZABLE caller).
Lock order:  none (shared locks released row by row, or none under RCSI).
Example:     EXEC mailq.GetQueueStats @RecentFailures = 10, @FinishedHours = 24;
*/
CREATE OR ALTER PROCEDURE mailq.GetQueueStats
    @RecentFailures INT = 20,
    @FinishedHours INT = 24
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @RecentFailures = COALESCE(@RecentFailures, 20);
    SET @FinishedHours = COALESCE(@FinishedHours, 24);
    IF @RecentFailures NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@RecentFailures must be 1-1000; got ', @RecentFailures, N'.');
        THROW 50146, @Msg, 1;
    END;
    IF @FinishedHours NOT BETWEEN 1 AND 168
    BEGIN
        SET @Msg = CONCAT(N'@FinishedHours must be 1-168 (a week); got ', @FinishedHours, N'.');
        THROW 50520, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    -- Whole hours: the window starts at the top of the oldest hour shown.
    DECLARE @FinishedSince DATETIME2(3) = DATEADD(
        HOUR, DATEDIFF(HOUR, '20000101', @Now) - @FinishedHours + 1, CAST('20000101' AS DATETIME2(3))
    );
    DECLARE @FailuresSince DATETIME2(3) = DATEADD(DAY, -7, @Now);
    SELECT
        q.Status,
        q.AccountName,
        COUNT_BIG(*) AS MailCount
    FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Status), FORCESEEK)
    WHERE q.Status IN (N'UnSent', N'Sending')
    GROUP BY q.Status, q.AccountName
    ORDER BY q.AccountName ASC, q.Status ASC;
    SELECT
        q.AccountName,
        MIN(q.VisibleAtUtc) AS OldestDueUtc,
        DATEDIFF_BIG(SECOND, MIN(q.VisibleAtUtc), @Now) AS OldestDueAgeSeconds,
        COUNT_BIG(*) AS DueCount
    FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Status), FORCESEEK)
    WHERE q.Status = N'UnSent' AND q.VisibleAtUtc <= @Now
    GROUP BY q.AccountName
    ORDER BY OldestDueAgeSeconds DESC;
    -- The final statuses as literals, so the filtered IX_MailQueue_Final matches.
    -- RECOMPILE: the hash or sort grant follows the window's rows, not a fixed 30%
    -- of the history (local variable estimate).
    SELECT
        DATEADD(HOUR, DATEDIFF(HOUR, '20000101', q.DateProcessed), CAST('20000101' AS DATETIME2(0))) AS HourUtc,
        q.AccountName,
        SUM(IIF(q.Status = N'Sent', 1, 0)) AS Sent,
        SUM(IIF(q.Status = N'Failed', 1, 0)) AS Failed,
        SUM(IIF(q.Status = N'Expired', 1, 0)) AS Expired,
        SUM(IIF(q.Status = N'Cancelled', 1, 0)) AS Cancelled,
        SUM(IIF(q.Status = N'Stopped', 1, 0)) AS Stopped
    FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Final), FORCESEEK)
    WHERE
        q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
        AND q.DateProcessed >= @FinishedSince
    GROUP BY
        DATEADD(HOUR, DATEDIFF(HOUR, '20000101', q.DateProcessed), CAST('20000101' AS DATETIME2(0))),
        q.AccountName
    ORDER BY HourUtc DESC, q.AccountName ASC
    OPTION (RECOMPILE);
    -- A backward range seek on EndedAtUtc, stopped after @RecentFailures rows.
    SELECT TOP (@RecentFailures)
        t.MailID AS ID,
        t.AttemptNo,
        q.AccountName,
        q.Status,
        t.Outcome,
        t.SmtpCode,
        t.ErrorText AS LastError,
        t.EndedAtUtc AS DateProcessed
    FROM mailq.MailAttempt AS t WITH (INDEX (IX_MailAttempt_EndedAtUtc), FORCESEEK)
    INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID))) ON t.MailID = q.ID
    WHERE
        t.EndedAtUtc IS NOT NULL
        AND t.EndedAtUtc >= @FailuresSince
        AND t.Outcome IN (N'Retry', N'Wait', N'Stop', N'Abandoned')
    ORDER BY t.EndedAtUtc DESC;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
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
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RecordRecipientOutcomes: records which recipients of a leased mail were
accepted (Delivered), refused for now (Deferred, 4xx) or for good (Refused, 5xx),
before MarkSent or MarkFailed 'Retry': the next attempt sends only to recipients
neither Delivered nor Refused (mailq.GetRecipientOutcomes).
Parameters:  @ID BIGINT, @LockToken UNIQUEIDENTIFIER, required (the lease fence)
             @Outcomes NVARCHAR(MAX), required: JSON array of 1-1000 {"address",
             "outcome": "Delivered"|"Deferred"|"Refused", "code": 200-599 or null,
             "text": up to 1000 characters}
Result set:  none.
Errors:      50180 @ID missing; 50181 @Outcomes malformed or an address not 1-320
             characters; 50182 unknown outcome; 50183 code not 200-599; 50184 an
             address twice; 50131, 50201-50203 (mailq.LockLeasedMail).
Transaction: its own or the caller's; an error writes nothing, dooms it, is re-raised.
Isolation:   READ COMMITTED, set here; the mail row's UPDLOCK serializes every
             writer of its recipients, also under RCSI.
Lock order:  mailq.MailQueue (the mail row), then mailq.MailRecipientOutcome.
Example:     EXEC mailq.RecordRecipientOutcomes @ID = 101, @LockToken = @T,
                 @Outcomes = N'[{"address":"a@example.com","outcome":"Delivered","code":250}]';
*/
CREATE OR ALTER PROCEDURE mailq.RecordRecipientOutcomes
    @ID BIGINT,
    @LockToken UNIQUEIDENTIFIER,
    @Outcomes NVARCHAR(MAX)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;  -- reverts when the procedure returns
    DECLARE @Msg NVARCHAR(2048);
    IF @ID IS NULL
        THROW 50180, N'@ID is required: the mail whose recipients are recorded.', 1;
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: the token the mail was claimed with.', 1;
    -- Separate statements: OR has no guaranteed order, so OPENJSON could meet
    -- non-JSON and raise 13609 instead of 50181.
    DECLARE @OutcomesOk BIT = 1;
    IF @Outcomes IS NULL OR ISJSON(@Outcomes) = 0 OR LEFT(LTRIM(@Outcomes), 1) <> N'['
        SET @OutcomesOk = 0;
    ELSE IF (SELECT COUNT(*) FROM OPENJSON(@Outcomes)) NOT BETWEEN 1 AND 1000
        SET @OutcomesOk = 0;
    ELSE IF EXISTS (SELECT 1 FROM OPENJSON(@Outcomes) AS j WHERE j.[type] <> 5)
        SET @OutcomesOk = 0;
    -- Lax JSON_VALUE: a missing or over-long address is NULL, and refused.
    ELSE IF EXISTS (
        SELECT 1
        FROM OPENJSON(@Outcomes) AS j
        WHERE ISNULL(LEN(JSON_VALUE(j.[value], N'$.address')), 0) NOT BETWEEN 1 AND 320
    )
        SET @OutcomesOk = 0;
    IF @OutcomesOk = 0
        THROW 50181,
            N'@Outcomes must be a JSON array of 1-1000 objects, each with an "address" of 1-320 characters.',
            1;
    DECLARE @Rows TABLE (
        Address NVARCHAR(320) NOT NULL,
        Outcome NVARCHAR(16) NULL,
        SmtpCode INT NULL,
        SmtpCodeText NVARCHAR(20) NULL,
        SmtpText NVARCHAR(1000) NULL
    );
    -- lax: a missing "code" or "text" (or one over 4000 characters) is NULL
    INSERT INTO @Rows (Address, Outcome, SmtpCode, SmtpCodeText, SmtpText)
    SELECT
        LOWER(JSON_VALUE(j.[value], N'$.address')),
        JSON_VALUE(j.[value], N'$.outcome'),
        TRY_CAST(JSON_VALUE(j.[value], N'$.code') AS INT),
        LEFT(JSON_VALUE(j.[value], N'$.code'), 20),
        LEFT(JSON_VALUE(j.[value], N'$.text'), 1000)
    FROM OPENJSON(@Outcomes) AS j;
    SELECT TOP (1) @Msg = CONCAT(N'@Outcomes: the outcome of ', r.Address, N' is ',
        COALESCE(N'"' + r.Outcome + N'"', N'missing'), N'; it must be Delivered, Deferred or Refused.')
    FROM @Rows AS r
    WHERE r.Outcome IS NULL OR r.Outcome NOT IN (N'Delivered', N'Deferred', N'Refused')
    ORDER BY r.Address;
    IF @Msg IS NOT NULL THROW 50182, @Msg, 1;
    SELECT TOP (1) @Msg = CONCAT(N'@Outcomes: the code of ', r.Address, N' is ', r.SmtpCodeText,
        N'; it must be an SMTP reply code 200-599 or null.')
    FROM @Rows AS r
    WHERE r.SmtpCodeText IS NOT NULL AND (r.SmtpCode IS NULL OR r.SmtpCode NOT BETWEEN 200 AND 599)
    ORDER BY r.Address;
    IF @Msg IS NOT NULL THROW 50183, @Msg, 1;
    SELECT TOP (1) @Msg = CONCAT(
        N'@Outcomes names ', r.Address, N' more than once (addresses compare case-insensitively).'
    )
    FROM @Rows AS r
    GROUP BY r.Address
    HAVING COUNT(*) > 1
    ORDER BY r.Address;
    IF @Msg IS NOT NULL THROW 50184, @Msg, 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @AttemptNo INT;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- the fence; the row stays UPDLOCKed until this transaction ends
        EXEC mailq.LockLeasedMail @ID = @ID, @LockToken = @LockToken;
        SELECT @AttemptNo = q.AttemptCount
        FROM mailq.MailQueue AS q
        WHERE q.ID = @ID;
        -- a Delivered or Refused recipient is final: a later attempt never changes it
        UPDATE o
        SET
            o.Outcome = r.Outcome,
            o.SmtpCode = r.SmtpCode,
            o.SmtpText = r.SmtpText,
            o.AttemptNo = @AttemptNo,
            o.UpdatedAtUtc = @Now
        FROM mailq.MailRecipientOutcome AS o
        INNER JOIN @Rows AS r ON o.Address = r.Address
        WHERE o.MailID = @ID AND o.Outcome = N'Deferred';
        INSERT INTO mailq.MailRecipientOutcome (MailID, Address, Outcome, SmtpCode, SmtpText, AttemptNo, UpdatedAtUtc)
        SELECT
            @ID,
            r.Address,
            r.Outcome,
            r.SmtpCode,
            r.SmtpText,
            @AttemptNo,
            @Now
        FROM @Rows AS r
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.MailRecipientOutcome AS o
            WHERE o.MailID = @ID AND o.Address = r.Address
        );
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetRecipientOutcomes: the recorded recipient outcomes of leased mails, so a
new attempt skips recipients Delivered or Refused; mails not leased under
@LockToken are left out (no error: the next fenced call finds out).
Parameters:  @IDList NVARCHAR(MAX) (JSON array of 1-1000), @LockToken UNIQUEIDENTIFIER
Result set:  one row per recorded recipient: MailID, Address, Outcome,
             SmtpCode, SmtpText, AttemptNo, UpdatedAtUtc.
Errors:      50131 @LockToken missing; 50185 @IDList not a JSON array of 1-1000 integers.
Transaction: reads only; none of its own.
Isolation:   READ COMMITTED, set here (no lock kept for a SERIALIZABLE caller).
Lock order:  mailq.MailQueue, then mailq.MailRecipientOutcome (shared, row by row).
Example:     EXEC mailq.GetRecipientOutcomes @IDList = N'[101,102]', @LockToken = @T;
*/
CREATE OR ALTER PROCEDURE mailq.GetRecipientOutcomes
    @IDList NVARCHAR(MAX),
    @LockToken UNIQUEIDENTIFIER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;  -- reverts when the procedure returns
    IF @LockToken IS NULL
        THROW 50131, N'@LockToken is required: the token the mails were claimed with.', 1;
    -- Separate statements: OR has no guaranteed order, so OPENJSON could meet
    -- non-JSON and raise 13609 instead of 50185.
    DECLARE @IDListOk BIT = 1;
    IF @IDList IS NULL OR ISJSON(@IDList) = 0 OR LEFT(LTRIM(@IDList), 1) <> N'['
        SET @IDListOk = 0;
    ELSE IF EXISTS (
        SELECT 1
        FROM OPENJSON(@IDList) AS j
        WHERE j.[type] <> 2 OR TRY_CAST(j.[value] AS BIGINT) IS NULL
    )
        SET @IDListOk = 0;
    ELSE IF (SELECT COUNT(*) FROM OPENJSON(@IDList)) NOT BETWEEN 1 AND 1000
        SET @IDListOk = 0;
    IF @IDListOk = 0
        THROW 50185, N'@IDList must be a JSON array of 1-1000 integer mail IDs, e.g. [101, 102].', 1;
    SELECT
        o.MailID,
        o.Address,
        o.Outcome,
        o.SmtpCode,
        o.SmtpText,
        o.AttemptNo,
        o.UpdatedAtUtc
    FROM mailq.ParseIDList(NULL, @IDList) AS l
    INNER JOIN mailq.MailQueue AS q ON l.ID = q.ID
    INNER JOIN mailq.MailRecipientOutcome AS o ON q.ID = o.MailID
    WHERE q.Status = N'Sending' AND q.ThreadLock = @LockToken
    ORDER BY o.MailID, o.Address;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetMailEvents: the event stream of one application or one mail after a cursor, in EventID
order, in bounded batches; commit-safe: only events below MIN_ACTIVE_ROWVERSION() (docs/events.md).
Parameters:  @AppName or @MailID, exactly one; @AfterEventID BIGINT >= 0, default 0; @MaxEvents 1-5000, default 500.
Result set:  EventID, MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail,
             OccurredAtUtc; fewer than @MaxEvents rows: up to date (for now).
Errors:      50170 not exactly one of @AppName / @MailID; 50171 @AfterEventID; 50172 @MaxEvents;
             50173 the caller is mapped to another application (a mapped user reads only its own).
Transaction: opens none.  Isolation: sets READ COMMITTED; the bound first, rows READCOMMITTEDLOCK.
Lock order:  mailq.MailEvent only (shared); a PurgeMail batch may make it a 1205 victim: call again.
Example:     EXEC mailq.GetMailEvents @AppName = N'billing', @AfterEventID = 41230;
*/
CREATE OR ALTER PROCEDURE mailq.GetMailEvents
    @AppName NVARCHAR(128) = NULL,
    @MailID BIGINT = NULL,
    @AfterEventID BIGINT = 0,
    @MaxEvents INT = 500
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF (@AppName IS NULL AND @MailID IS NULL) OR (@AppName IS NOT NULL AND @MailID IS NOT NULL)
        THROW 50170, N'Pass exactly one of @AppName and @MailID.', 1;
    IF @AfterEventID IS NULL OR @AfterEventID < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@AfterEventID must be 0 or an EventID already read; got ',
            COALESCE(CAST(@AfterEventID AS NVARCHAR(24)), N'NULL'), N'.'
        );
        THROW 50171, @Msg, 1;
    END;
    SET @MaxEvents = COALESCE(@MaxEvents, 500);
    IF @MaxEvents NOT BETWEEN 1 AND 5000
    BEGIN
        SET @Msg = CONCAT(N'@MaxEvents must be 1-5000; got ', @MaxEvents, N'.');
        THROW 50172, @Msg, 1;
    END;
    DECLARE @PrincipalApp NVARCHAR(128) = (
        SELECT u.AppName FROM mailq.ApplicationPrincipal AS u WHERE u.PrincipalName = USER_NAME()
    );
    IF @PrincipalApp IS NOT NULL AND @AppName IS NOT NULL AND @AppName <> @PrincipalApp
    BEGIN
        SET @Msg = CONCAT(
            N'Database user ', QUOTENAME(USER_NAME()), N' reads the events of application ''', @PrincipalApp,
            N''' only; got @AppName ''', @AppName, N'''.'
        );
        THROW 50173, @Msg, 1;
    END;
    DECLARE @After BINARY(8) = CAST(@AfterEventID AS BINARY(8));  -- big-endian, as rowversions compare
    DECLARE @Upper BINARY(8) = MIN_ACTIVE_ROWVERSION();
    IF @AppName IS NOT NULL
        SELECT TOP (@MaxEvents)
            CAST(e.EventSeq AS BIGINT) AS EventID,
            e.MailID,
            e.AppName,
            e.EventType,
            e.Status,
            e.AttemptCount,
            e.SmtpCode,
            e.Detail,
            e.OccurredAtUtc
        FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_AppName), FORCESEEK, READCOMMITTEDLOCK)
        WHERE e.AppName = @AppName AND e.EventSeq > @After AND e.EventSeq < @Upper
        ORDER BY e.EventSeq ASC;
    ELSE
        SELECT TOP (@MaxEvents)
            CAST(e.EventSeq AS BIGINT) AS EventID,
            e.MailID,
            e.AppName,
            e.EventType,
            e.Status,
            e.AttemptCount,
            e.SmtpCode,
            e.Detail,
            e.OccurredAtUtc
        FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_MailID), FORCESEEK, READCOMMITTEDLOCK)
        WHERE
            e.MailID = @MailID AND e.EventSeq > @After AND e.EventSeq < @Upper
            AND (@PrincipalApp IS NULL OR e.AppName = @PrincipalApp)
        ORDER BY e.EventSeq ASC;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.StopMail: ends a mail that is not final with Status 'Stopped' and a reason.
A Sending mail loses its lease and its open attempt is closed (Outcome 'Stop'), so
the worker's acknowledgement is refused (50203); a copy already in an SMTP
transaction may still arrive: PossibleDuplicate is set.  RequeueMail undoes it.
Parameters:  @MailID BIGINT, @Reason NVARCHAR(4000) (LastError, event Detail): required
Result set:  one row: ID, Status ('Stopped'), NextAttemptUtc (NULL).
Errors:      50174 @MailID missing; 50175 @Reason blank; 50201 unknown; 50260 final.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK check-then-update).
Lock order:  mailq.MailQueue, then mailq.MailEvent, then mailq.MailAttempt.
Example:     EXEC mailq.StopMail @MailID = 101, @Reason = N'Customer closed the account.';
*/
CREATE OR ALTER PROCEDURE mailq.StopMail
    @MailID BIGINT,
    @Reason NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @MailID IS NULL
        THROW 50174, N'@MailID is required.', 1;
    IF NULLIF(LTRIM(RTRIM(@Reason)), N'') IS NULL
        THROW 50175, N'@Reason is required: say why the mail is stopped.', 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Status NVARCHAR(16);
    DECLARE @OldLockToken UNIQUEIDENTIFIER;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- UPDLOCK: no claim or acknowledgement slips in between check and change.
        SELECT
            @Status = q.Status,
            @OldLockToken = q.ThreadLock
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
        WHERE q.ID = @MailID;
        IF @Status IS NULL
        BEGIN
            SET @Msg = CONCAT(N'Mail ', @MailID, N' does not exist.');
            THROW 50201, @Msg, 1;
        END;
        IF @Status NOT IN (N'UnSent', N'Sending')
        BEGIN
            SET @Msg = CONCAT(
                N'Mail ', @MailID, N' is already ', @Status, N'; only an UnSent or Sending mail can be stopped.'
            );
            THROW 50260, @Msg, 1;
        END;
        -- Change and event in one statement (MailEvent has no trigger, FK or CHECK).
        -- A leased mail may be mid-SMTP: flag it, as FinalizeMail does.
        UPDATE q
        SET
            q.Status = N'Stopped',
            q.ThreadLock = NULL,
            q.PossibleDuplicate = IIF(q.Status = N'Sending', CAST(1 AS BIT), q.PossibleDuplicate),
            q.DateProcessed = @Now,
            q.LastError = @Reason
        OUTPUT
            inserted.ID, inserted.AppName, N'Stopped', inserted.Status, inserted.AttemptCount,
            NULL, @Reason, @Now
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        WHERE q.ID = @MailID;
        -- A leased mail: close the worker's open attempt (seek by mail ID).
        IF @Status = N'Sending'
            UPDATE t
            SET
                t.EndedAtUtc = @Now,
                t.Outcome = N'Stop',
                t.ErrorText = LEFT(CONCAT(N'Stopped by mailq.StopMail: ', @Reason), 4000)
            FROM mailq.MailAttempt AS t WITH (FORCESEEK, ROWLOCK)
            WHERE t.MailID = @MailID AND t.LockToken = @OldLockToken AND t.EndedAtUtc IS NULL;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        @MailID AS ID,
        N'Stopped' AS Status,
        CAST(NULL AS DATETIME2(3)) AS NextAttemptUtc;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.SetApplicationHook: registers, re-pins or removes one application's hook
(docs/hooks.md) and grants MailqRunner EXECUTE on it (revoking the replaced one's).
db_owner only.  The hook: a two-part SQL procedure in a dbo-owned schema, readable
definition (pinned: object_id and SHA2_256), with exactly these parameters:
  @EventID BIGINT, @MailID BIGINT, @AppName NVARCHAR(128), @EventType NVARCHAR(32),
  @Status NVARCHAR(16), @SmtpCode INT, @Detail NVARCHAR(4000), @StopMail BIT OUTPUT,
  @StopReason NVARCHAR(4000) OUTPUT
Parameters:  @AppName NVARCHAR(128); @HookProcedure NVARCHAR(300) (NULL = remove);
             @MaxAttempts INT = 3 (1-100); @ResetCursorTo BIGINT = NULL (else a new
             hook starts at the end of the stream, a re-registration keeps its cursor)
Result set:  one row: AppName, HookProcedure (NULL if removed), ObjectId,
             CursorEventID, MaxAttempts, Changed BIT
Errors:      50290 @AppName not registered; 50291 not a two-part SQL procedure, or a
             system one; 50292 schema not owned by dbo, or another owner; 50293
             parameters differ; 50294 definition unreadable; 50295 @MaxAttempts or
             @ResetCursorTo out of range
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED (UPDLOCK, HOLDLOCK update-else-insert).
Lock order:  mailq.ApplicationHook only.
Example:     EXEC mailq.SetApplicationHook @AppName = N'billing', @HookProcedure = N'billing.OnMailEvent';
*/
CREATE OR ALTER PROCEDURE mailq.SetApplicationHook
    @AppName NVARCHAR(128),
    @HookProcedure NVARCHAR(300),
    @MaxAttempts INT = 3,
    @ResetCursorTo BIGINT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE
        @Msg NVARCHAR(2048),
        @Part1 SYSNAME,
        @Part2 SYSNAME,
        @SchemaName SYSNAME,
        @Name SYSNAME,
        @ObjectId INT,
        @IsShipped BIT,
        @SchemaOwner INT,
        @ObjectOwner INT,
        @Problems NVARCHAR(2000),
        @DefinitionHash VARBINARY(32),
        @Changed BIT = 1,
        @OldObjectId INT,
        @Grant NVARCHAR(600);
    IF @AppName IS NULL OR NOT EXISTS (SELECT 1 FROM mailq.Application AS a WHERE a.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(
            N'@AppName must name a registered application (mailq.UpsertApplication); got ',
            COALESCE(N'''' + @AppName + N'''', N'NULL'), N'.'
        );
        THROW 50290, @Msg, 1;
    END;
    SET @MaxAttempts = COALESCE(@MaxAttempts, 3);
    IF @MaxAttempts NOT BETWEEN 1 AND 100 OR @ResetCursorTo < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@MaxAttempts must be 1-100 and @ResetCursorTo 0 or more; got ', @MaxAttempts, N' and ',
            COALESCE(CAST(@ResetCursorTo AS NVARCHAR(24)), N'NULL'), N'.'
        );
        THROW 50295, @Msg, 1;
    END;
    IF @HookProcedure IS NOT NULL
    BEGIN
        -- PARSENAME takes a sysname: refuse what it would cut.
        IF DATALENGTH(@HookProcedure) BETWEEN 2 AND 256
            AND PARSENAME(@HookProcedure, 3) IS NULL
            AND PARSENAME(@HookProcedure, 4) IS NULL
            SELECT
                @Part1 = PARSENAME(@HookProcedure, 1),
                @Part2 = PARSENAME(@HookProcedure, 2);
        SELECT
            @ObjectId = o.object_id,
            @SchemaName = s.name,
            @Name = o.name,
            @IsShipped = o.is_ms_shipped,
            @SchemaOwner = s.principal_id,
            @ObjectOwner = o.principal_id
        FROM sys.objects AS o
        INNER JOIN sys.schemas AS s ON o.schema_id = s.schema_id
        WHERE
            s.name = @Part2
            AND o.name = @Part1
            AND o.type = 'P';
        IF @ObjectId IS NULL OR @IsShipped = 1 OR @SchemaName IN (N'sys', N'INFORMATION_SCHEMA')
        BEGIN
            SET @Msg = CONCAT(
                N'@HookProcedure must be schema.procedure naming an existing SQL procedure of this database ',
                N'(not a system procedure); got ', LEFT(@HookProcedure, 300), N'.'
            );
            THROW 50291, @Msg, 1;
        END;
        -- principal_id: the owner when it differs from the schema's, else NULL (dbo: 1).
        IF @SchemaOwner <> 1 OR COALESCE(@ObjectOwner, 1) <> 1
        BEGIN
            SET @Msg = CONCAT(
                N'@HookProcedure ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
                N' must be in a schema owned by dbo and have no other owner; schema owner ',
                QUOTENAME(USER_NAME(@SchemaOwner)), N', object owner ',
                COALESCE(QUOTENAME(USER_NAME(@ObjectOwner)), N'(the schema''s)'), N'.'
            );
            THROW 50292, @Msg, 1;
        END;
        -- Missing or different first, then extra; lengths in bytes (NVARCHAR(n): 2n).
        SELECT @Problems = STRING_AGG(x.Problem, N'; ') WITHIN GROUP (ORDER BY x.Ord)
        FROM (
            SELECT
                e.Ord,
                CONCAT(
                    e.ParameterName, N' ', e.Declared,
                    IIF(p.parameter_id IS NULL, N' is missing', N' is declared differently')
                ) AS Problem
            FROM (
                VALUES
                    (1, N'@EventID', N'bigint', 8, 0, N'BIGINT'),
                    (2, N'@MailID', N'bigint', 8, 0, N'BIGINT'),
                    (3, N'@AppName', N'nvarchar', 256, 0, N'NVARCHAR(128)'),
                    (4, N'@EventType', N'nvarchar', 64, 0, N'NVARCHAR(32)'),
                    (5, N'@Status', N'nvarchar', 32, 0, N'NVARCHAR(16)'),
                    (6, N'@SmtpCode', N'int', 4, 0, N'INT'),
                    (7, N'@Detail', N'nvarchar', 8000, 0, N'NVARCHAR(4000)'),
                    (8, N'@StopMail', N'bit', 1, 1, N'BIT OUTPUT'),
                    (9, N'@StopReason', N'nvarchar', 8000, 1, N'NVARCHAR(4000) OUTPUT')
            ) AS e(Ord, ParameterName, TypeName, MaxLength, IsOutput, Declared)
            LEFT JOIN sys.parameters AS p
                ON e.ParameterName = p.name AND p.object_id = @ObjectId
            WHERE
                p.parameter_id IS NULL
                OR TYPE_NAME(p.user_type_id) <> e.TypeName
                OR p.max_length <> e.MaxLength
                OR p.is_output <> e.IsOutput
            UNION ALL
            SELECT 100 + p.parameter_id, CONCAT(p.name, N' is not a hook parameter')
            FROM sys.parameters AS p
            WHERE
                p.object_id = @ObjectId
                AND p.name NOT IN (
                    N'@EventID', N'@MailID', N'@AppName', N'@EventType', N'@Status', N'@SmtpCode',
                    N'@Detail', N'@StopMail', N'@StopReason'
                )
        ) AS x;
        IF @Problems IS NOT NULL
        BEGIN
            SET @Msg = CONCAT(
                N'@HookProcedure ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
                N' must take exactly the hook parameters (docs/hooks.md): ', LEFT(@Problems, 1500), N'.'
            );
            THROW 50293, @Msg, 1;
        END;
        SET @DefinitionHash = HASHBYTES('SHA2_256', OBJECT_DEFINITION(@ObjectId));
        IF @DefinitionHash IS NULL
        BEGIN
            SET @Msg = CONCAT(
                N'@HookProcedure ', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name),
                N' has no readable definition (WITH ENCRYPTION?), so it cannot be pinned.'
            );
            THROW 50294, @Msg, 1;
        END;
    END;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        SELECT @OldObjectId = h.ObjectId
        FROM mailq.ApplicationHook AS h WITH (UPDLOCK, HOLDLOCK)
        WHERE h.AppName = @AppName;
        IF @HookProcedure IS NULL
        BEGIN
            DELETE h
            FROM mailq.ApplicationHook AS h WITH (UPDLOCK, HOLDLOCK)
            WHERE h.AppName = @AppName;
            SET @Changed = IIF(@@ROWCOUNT = 0, 0, 1);
        END;
        ELSE
        BEGIN
            -- UPDLOCK, HOLDLOCK: update-else-insert without a race between the two.
            UPDATE h
            SET
                h.SchemaName = @SchemaName,
                h.ProcedureName = @Name,
                h.ObjectId = @ObjectId,
                h.DefinitionHash = @DefinitionHash,
                h.MaxAttempts = @MaxAttempts,
                h.CursorEventID = COALESCE(@ResetCursorTo, h.CursorEventID),
                h.FailingEventID = IIF(@ResetCursorTo IS NULL, h.FailingEventID, NULL),
                h.FailCount = IIF(@ResetCursorTo IS NULL, h.FailCount, 0),
                h.LastError = NULL,
                h.RegisteredAtUtc = SYSUTCDATETIME(),
                h.RegisteredBy = ORIGINAL_LOGIN()
            FROM mailq.ApplicationHook AS h WITH (UPDLOCK, HOLDLOCK)
            WHERE h.AppName = @AppName;
            -- A new hook starts at the end of the stream (see mailq.GetMailEvents).
            IF @@ROWCOUNT = 0
                INSERT INTO mailq.ApplicationHook (
                    AppName, SchemaName, ProcedureName, ObjectId, DefinitionHash, MaxAttempts, CursorEventID
                )
                VALUES (
                    @AppName, @SchemaName, @Name, @ObjectId, @DefinitionHash, @MaxAttempts,
                    COALESCE(@ResetCursorTo, CAST(MIN_ACTIVE_ROWVERSION() AS BIGINT) - 1)
                );
        END;
        -- MailqRunner may execute exactly the registered hooks (names QUOTENAMEd).
        IF @OldObjectId IS NOT NULL AND @OldObjectId <> ISNULL(@ObjectId, 0)
            AND NOT EXISTS (SELECT 1 FROM mailq.ApplicationHook AS h WHERE h.ObjectId = @OldObjectId)
            AND OBJECT_NAME(@OldObjectId) IS NOT NULL
        BEGIN
            SET @Grant = CONCAT(
                N'REVOKE EXECUTE ON OBJECT::', QUOTENAME(OBJECT_SCHEMA_NAME(@OldObjectId)), N'.',
                QUOTENAME(OBJECT_NAME(@OldObjectId)), N' FROM MailqRunner;'
            );
            EXEC sys.sp_executesql @Grant;
        END;
        IF @HookProcedure IS NOT NULL
        BEGIN
            SET @Grant = CONCAT(
                N'GRANT EXECUTE ON OBJECT::', QUOTENAME(@SchemaName), N'.', QUOTENAME(@Name), N' TO MailqRunner;'
            );
            EXEC sys.sp_executesql @Grant;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    -- One row whether or not a hook remains (a removal returns NULLs).
    DECLARE
        @ResultProcedure NVARCHAR(300),
        @ResultObjectId INT,
        @ResultCursor BIGINT,
        @ResultMaxAttempts INT;
    SELECT
        @ResultProcedure = CONCAT(QUOTENAME(h.SchemaName), N'.', QUOTENAME(h.ProcedureName)),
        @ResultObjectId = h.ObjectId,
        @ResultCursor = h.CursorEventID,
        @ResultMaxAttempts = h.MaxAttempts
    FROM mailq.ApplicationHook AS h
    WHERE h.AppName = @AppName;
    SELECT
        @AppName AS AppName,
        @ResultProcedure AS HookProcedure,
        @ResultObjectId AS ObjectId,
        @ResultCursor AS CursorEventID,
        @ResultMaxAttempts AS MaxAttempts,
        @Changed AS Changed;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RunApplicationHooks: the hook dispatcher (docs/hooks.md): calls each hooked
application's hook once per committed event after its cursor, in EventID order, as
MailqRunner, each call in its own transaction with its @StopMail and the cursor
move; an equal share of @MaxEvents per application; one dispatcher at a time.  A
hook no longer pinned (mailq.HookPin) is suspended; a failing call is retried on
later runs, then recorded in mailq.ApplicationHookFailure and skipped.
Parameters:  @MaxEvents INT = 500 (1-5000); @Quiet BIT = 0 (1: no result set)
Result set:  one row per hooked application: AppName, HookProcedure, Calls,
             Succeeded, FailedCalls, GivenUp, CursorEventID, State (UpToDate | More |
             Retrying | Suspended | Moved); or one row, AppName NULL, State 'Busy'.
Errors:      50295 @MaxEvents outside 1-5000; 50296 called inside a transaction;
             50297 (caught, counted) the hook ended or left open a transaction.
Transaction: none open on entry; one per hook call, one per failure record.
Isolation:   READ COMMITTED; events read with READCOMMITTEDLOCK below the bound.
Lock order:  per call: the hook's, mailq.MailQueue (StopMail), mailq.ApplicationHook;
             failures: ApplicationHookFailure, ApplicationHook.
Security:    EXECUTE AS OWNER; the hook runs as MailqRunner.  Granted to MailqAdmin.
Example:     EXEC mailq.RunApplicationHooks @MaxEvents = 500;
*/
CREATE OR ALTER PROCEDURE mailq.RunApplicationHooks
    @MaxEvents INT = 500,
    @Quiet BIT = 0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @MaxEvents = COALESCE(@MaxEvents, 500);
    IF @MaxEvents NOT BETWEEN 1 AND 5000
    BEGIN
        SET @Msg = CONCAT(N'@MaxEvents must be 1-5000; got ', @MaxEvents, N'.');
        THROW 50295, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50296,
            N'mailq.RunApplicationHooks runs each hook call in its own transaction: call it outside any transaction.',
            1;
    DECLARE @Summary TABLE (
        AppName NVARCHAR(128) NOT NULL PRIMARY KEY,
        HookProcedure NVARCHAR(300) NOT NULL,
        Calls INT NOT NULL DEFAULT (0),
        Succeeded INT NOT NULL DEFAULT (0),
        FailedCalls INT NOT NULL DEFAULT (0),
        GivenUp INT NOT NULL DEFAULT (0),
        CursorEventID BIGINT NOT NULL,
        State NVARCHAR(16) NOT NULL DEFAULT (N'UpToDate')
    );
    DECLARE @Page TABLE (
        EventID BIGINT NOT NULL PRIMARY KEY,
        MailID BIGINT NOT NULL,
        EventType NVARCHAR(32) NOT NULL,
        Status NVARCHAR(16) NOT NULL,
        SmtpCode INT NULL,
        Detail NVARCHAR(4000) NULL
    );
    DECLARE
        @LockResult INT,
        @Budget INT = @MaxEvents,
        @App NVARCHAR(128) = N'',
        @SchemaName SYSNAME,
        @ProcedureName SYSNAME,
        @ObjectId INT,
        @DefinitionHash VARBINARY(32),
        @Hook NVARCHAR(300),
        @Cursor BIGINT,
        @FailingEventID BIGINT,
        @FailCount INT,
        @MaxAttempts INT,
        @Upper BINARY(8),
        @EventID BIGINT,
        @MailID BIGINT,
        @EventType NVARCHAR(32),
        @Status NVARCHAR(16),
        @SmtpCode INT,
        @Detail NVARCHAR(4000),
        @StopMail BIT,
        @StopReason NVARCHAR(4000),
        @MailStatus NVARCHAR(16),
        @Sql NVARCHAR(MAX),
        @ErrorNumber INT,
        @ErrorMessage NVARCHAR(4000),
        @TranCountInCatch INT,
        @Modified DATETIME,
        @Changed BIT,
        @Attempts INT,
        @GiveUp BIT,
        @Moved BIT,
        @AppState NVARCHAR(16),
        @PerApp INT,
        @AppCalls INT,
        @Now DATETIME2(3),
        @Suspend NVARCHAR(200),
        @NotPinned NVARCHAR(200) = CONCAT(
            N' was altered, dropped, recreated, renamed or changed owner since ',
            N'it was registered; review it and run mailq.SetApplicationHook again.'
        );
    DECLARE @Stopped TABLE (ID BIGINT, Status NVARCHAR(16), NextAttemptUtc DATETIME2(3));
    DECLARE @ParameterList NVARCHAR(400) = N'@EventID BIGINT, @MailID BIGINT, @AppName NVARCHAR(128), '
        + N'@EventType NVARCHAR(32), @Status NVARCHAR(16), @SmtpCode INT, @Detail NVARCHAR(4000), '
        + N'@StopMail BIT OUTPUT, @StopReason NVARCHAR(4000) OUTPUT';
    -- Session-owned: it spans the per-call transactions.
    EXEC @LockResult = sys.sp_getapplock
        @Resource = N'mailq.RunApplicationHooks',
        @LockMode = N'Exclusive',
        @LockOwner = N'Session',
        @LockTimeout = 0;
    IF @LockResult < 0
    BEGIN
        IF @Quiet = 0
            SELECT
                CAST(NULL AS NVARCHAR(128)) AS AppName,
                CAST(NULL AS NVARCHAR(300)) AS HookProcedure,
                0 AS Calls, 0 AS Succeeded, 0 AS FailedCalls, 0 AS GivenUp,
                CAST(NULL AS BIGINT) AS CursorEventID,
                N'Busy' AS State;
        RETURN;
    END;
    BEGIN TRY
        SET @PerApp = (SELECT CEILING(@MaxEvents * 1.0 / NULLIF(COUNT(*), 0)) FROM mailq.ApplicationHook);
        WHILE @Budget > 0
        BEGIN
            SET @SchemaName = NULL;
            SELECT TOP (1)
                @App = h.AppName,
                @SchemaName = h.SchemaName,
                @ProcedureName = h.ProcedureName,
                @ObjectId = h.ObjectId,
                @DefinitionHash = h.DefinitionHash,
                @Cursor = h.CursorEventID,
                @FailingEventID = h.FailingEventID,
                @FailCount = h.FailCount,
                @MaxAttempts = h.MaxAttempts
            FROM mailq.ApplicationHook AS h
            WHERE h.AppName > @App
            ORDER BY h.AppName ASC;
            IF @SchemaName IS NULL BREAK;
            SET @Hook = CONCAT(QUOTENAME(@SchemaName), N'.', QUOTENAME(@ProcedureName));
            SELECT @AppState = N'UpToDate', @AppCalls = 0, @Suspend = NULL;
            INSERT INTO @Summary (AppName, HookProcedure, CursorEventID) VALUES (@App, @Hook, @Cursor);
            IF NOT EXISTS (SELECT 1 FROM mailq.HookPin(@ObjectId, @SchemaName, @ProcedureName, @DefinitionHash))
                SET @Suspend = @NotPinned;
            ELSE
            BEGIN
                -- QUOTENAMEd catalog names; the values are parameters, never text.
                SET @Sql = CONCAT(
                    N'SET ANSI_NULLS, ANSI_WARNINGS, ANSI_PADDING, QUOTED_IDENTIFIER, ARITHABORT, ',
                    N'CONCAT_NULL_YIELDS_NULL ON; SET NUMERIC_ROUNDABORT OFF; SET XACT_ABORT OFF; ',
                    N'SET DEADLOCK_PRIORITY NORMAL; SET LOCK_TIMEOUT 5000; EXEC ', @Hook,
                    N' @EventID = @EventID, @MailID = @MailID, @AppName = @AppName, @EventType = @EventType,',
                    N' @Status = @Status, @SmtpCode = @SmtpCode, @Detail = @Detail,',
                    N' @StopMail = @StopMail OUTPUT, @StopReason = @StopReason OUTPUT;'
                );
                -- GetMailEvents' commit-safe read: bound first, then a locking read below it.
                DELETE FROM @Page;
                SET @Upper = MIN_ACTIVE_ROWVERSION();
                INSERT INTO @Page (EventID, MailID, EventType, Status, SmtpCode, Detail)
                SELECT TOP (IIF(@PerApp < @Budget, @PerApp, @Budget))
                    CAST(e.EventSeq AS BIGINT),
                    e.MailID,
                    e.EventType,
                    e.Status,
                    e.SmtpCode,
                    e.Detail
                FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_AppName), FORCESEEK, READCOMMITTEDLOCK)
                WHERE e.AppName = @App AND e.EventSeq > CAST(@Cursor AS BINARY(8)) AND e.EventSeq < @Upper
                ORDER BY e.EventSeq ASC;
                WHILE @Budget > 0 AND @AppCalls < @PerApp
                BEGIN
                    SELECT TOP (1)
                        @EventID = p.EventID,
                        @MailID = p.MailID,
                        @EventType = p.EventType,
                        @Status = p.Status,
                        @SmtpCode = p.SmtpCode,
                        @Detail = p.Detail
                    FROM @Page AS p
                    WHERE p.EventID > @Cursor
                    ORDER BY p.EventID ASC;
                    IF @@ROWCOUNT = 0 BREAK;
                    -- The pin again before every call: an altered hook is not called again.
                    SET @Modified = NULL;
                    SELECT @Modified = p.ModifyDate
                    FROM mailq.HookPin(@ObjectId, @SchemaName, @ProcedureName, @DefinitionHash) AS p;
                    IF @Modified IS NULL
                    BEGIN
                        SET @Suspend = @NotPinned;
                        BREAK;
                    END;
                    SELECT
                        @Budget -= 1,
                        @AppCalls += 1,
                        @StopMail = 0,
                        @StopReason = NULL,
                        @ErrorNumber = NULL,
                        @ErrorMessage = NULL,
                        @TranCountInCatch = NULL,
                        @Moved = 0,
                        @GiveUp = 0;
                    UPDATE @Summary SET Calls += 1 WHERE AppName = @App;
                    -- 1. Call, stop and cursor in one transaction.  REVERT in a module undoes only
                    --    its own EXECUTE AS: the hook cannot keep or undo ours.
                    SET @Changed = 0;
                    BEGIN TRANSACTION;
                    EXECUTE AS USER = N'MailqRunner';
                    BEGIN TRY
                        EXEC sys.sp_executesql
                            @Sql,
                            @ParameterList,
                            @EventID = @EventID,
                            @MailID = @MailID,
                            @AppName = @App,
                            @EventType = @EventType,
                            @Status = @Status,
                            @SmtpCode = @SmtpCode,
                            @Detail = @Detail,
                            @StopMail = @StopMail OUTPUT,
                            @StopReason = @StopReason OUTPUT;
                    END TRY
                    BEGIN CATCH
                        SELECT
                            @ErrorNumber = ERROR_NUMBER(),
                            @ErrorMessage = LEFT(ERROR_MESSAGE(), 4000),
                            @TranCountInCatch = @@TRANCOUNT;
                    END CATCH;
                    REVERT;
                    IF @ErrorNumber IS NULL
                    BEGIN
                        BEGIN TRY
                            -- 266 normally comes first; a count that still differs is the same fault.
                            IF @@TRANCOUNT <> 1
                                THROW 50297,
                                    N'The hook ended the transaction opened for it or left one of its own open.',
                                    1;
                            -- The code that ran is the code that was checked (same ModifyDate).
                            IF NOT EXISTS (
                                SELECT 1
                                FROM mailq.HookPin(@ObjectId, @SchemaName, @ProcedureName, @DefinitionHash) AS p
                                WHERE p.ModifyDate = @Modified
                            )
                            BEGIN
                                SET @Changed = 1;
                                ROLLBACK TRANSACTION;
                            END;
                            IF @Changed = 0 AND @StopMail = 1
                            BEGIN
                                -- Only a mail not yet final (StopMail refuses one, 50260).  UPDLOCK: StopMail
                                -- takes this row's U lock next.
                                SET @MailStatus = NULL;
                                SELECT @MailStatus = q.Status
                                FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
                                WHERE q.ID = @MailID;
                                IF @MailStatus IN (N'UnSent', N'Sending')
                                BEGIN
                                    SET @StopReason = COALESCE(
                                        NULLIF(LTRIM(RTRIM(@StopReason)), N''),
                                        CONCAT(
                                            N'Stopped by the hook ', @Hook, N' on event ', @EventID,
                                            N' (', @EventType, N').'
                                        )
                                    );
                                    -- StopMail's one-row result is kept here, not sent to our caller.
                                    DELETE FROM @Stopped;
                                    INSERT INTO @Stopped (ID, Status, NextAttemptUtc)
                                    EXEC mailq.StopMail @MailID = @MailID, @Reason = @StopReason;
                                END;
                            END;
                            -- Guarded: a re-registration meanwhile (@ResetCursorTo) undoes this call.
                            IF @Changed = 0
                            BEGIN
                                UPDATE h
                                SET
                                    h.CursorEventID = @EventID,
                                    h.FailingEventID = NULL,
                                    h.FailCount = 0,
                                    h.LastError = NULL,
                                    h.LastRunAtUtc = SYSUTCDATETIME()
                                FROM mailq.ApplicationHook AS h
                                WHERE h.AppName = @App AND h.CursorEventID = @Cursor AND h.ObjectId = @ObjectId;
                                IF @@ROWCOUNT = 0
                                BEGIN
                                    SET @Moved = 1;
                                    ROLLBACK TRANSACTION;
                                END;
                                ELSE
                                    COMMIT TRANSACTION;
                            END;
                        END TRY
                        BEGIN CATCH
                            SELECT
                                @ErrorNumber = ERROR_NUMBER(),
                                @ErrorMessage = LEFT(ERROR_MESSAGE(), 4000),
                                @TranCountInCatch = @@TRANCOUNT;
                            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
                        END CATCH;
                    END;
                    -- A failed call: undone as a whole (doomed or not).
                    ELSE IF XACT_STATE() <> 0
                        ROLLBACK TRANSACTION;
                    IF @Changed = 1
                    BEGIN
                        SET @Suspend = CONCAT(
                            N' was altered while it was called; the call was rolled back. ',
                            N'Review it and run mailq.SetApplicationHook again.'
                        );
                        BREAK;
                    END;
                    IF @Moved = 1
                    BEGIN
                        UPDATE @Summary SET State = N'Moved' WHERE AppName = @App;
                        SET @AppState = N'Moved';
                        BREAK;
                    END;
                    IF @ErrorNumber IS NULL
                    BEGIN
                        SET @Cursor = @EventID;
                        SELECT @FailingEventID = NULL, @FailCount = 0;
                        UPDATE @Summary SET Succeeded += 1, CursorEventID = @EventID WHERE AppName = @App;
                        CONTINUE;
                    END;
                    -- 2. A failed call: count it, or give the event up.
                    SET @Attempts = IIF(@FailingEventID = @EventID, @FailCount, 0) + 1;
                    -- 266, no transaction left: the hook ended ours; its work may be committed.
                    IF @ErrorNumber = 266 AND @TranCountInCatch = 0 SET @GiveUp = 1;
                    IF @Attempts >= @MaxAttempts SET @GiveUp = 1;
                    SET @ErrorMessage = LEFT(CONCAT(
                        N'Event ', @EventID, N' (', @EventType, N', mail ', @MailID, N'), call ', @Attempts,
                        N' of ', @MaxAttempts, N': error ', @ErrorNumber, N': ', @ErrorMessage
                    ), 4000);
                    SET @Now = SYSUTCDATETIME();
                    UPDATE @Summary SET FailedCalls += 1 WHERE AppName = @App;
                    BEGIN TRANSACTION;
                    IF @GiveUp = 1
                        INSERT INTO mailq.ApplicationHookFailure (
                            AppName, EventID, MailID, EventType, HookProcedure, Attempts, ErrorNumber, ErrorMessage
                        )
                        VALUES (@App, @EventID, @MailID, @EventType, @Hook, @Attempts, @ErrorNumber, @ErrorMessage);
                    UPDATE h
                    SET
                        h.CursorEventID = IIF(@GiveUp = 1, @EventID, h.CursorEventID),
                        h.FailingEventID = IIF(@GiveUp = 1, NULL, @EventID),
                        h.FailCount = IIF(@GiveUp = 1, 0, @Attempts),
                        h.LastError = @ErrorMessage,
                        h.LastRunAtUtc = @Now
                    FROM mailq.ApplicationHook AS h
                    WHERE h.AppName = @App AND h.CursorEventID = @Cursor AND h.ObjectId = @ObjectId;
                    IF @@ROWCOUNT = 0
                    BEGIN
                        ROLLBACK TRANSACTION;
                        UPDATE @Summary SET State = N'Moved' WHERE AppName = @App;
                        SET @AppState = N'Moved';
                        BREAK;
                    END;
                    COMMIT TRANSACTION;
                    IF @GiveUp = 1
                    BEGIN
                        SET @Cursor = @EventID;
                        SELECT @FailingEventID = NULL, @FailCount = 0;
                        UPDATE @Summary SET GivenUp += 1, CursorEventID = @EventID WHERE AppName = @App;
                        CONTINUE;
                    END;
                    -- Retry on a later run (the interval between runs is the backoff).
                    UPDATE @Summary SET State = N'Retrying' WHERE AppName = @App;
                    SET @AppState = N'Retrying';
                    BREAK;
                END;
            END;
            -- The one write of 'Suspended', for the three reasons above; no transaction is open here.
            IF @Suspend IS NOT NULL
            BEGIN
                UPDATE h
                SET
                    h.LastError = CONCAT(N'Suspended: ', @Hook, @Suspend),
                    h.LastRunAtUtc = SYSUTCDATETIME()
                FROM mailq.ApplicationHook AS h
                WHERE h.AppName = @App AND h.ObjectId = @ObjectId AND h.DefinitionHash = @DefinitionHash  -- the pin
                    AND h.SchemaName = @SchemaName AND h.ProcedureName = @ProcedureName;  -- it checked, not a new one
                UPDATE @Summary SET State = N'Suspended' WHERE AppName = @App;
                SET @AppState = N'Suspended';
            END;
            IF @AppState = N'UpToDate'
            BEGIN
                UPDATE h
                SET h.LastRunAtUtc = SYSUTCDATETIME()
                FROM mailq.ApplicationHook AS h
                WHERE h.AppName = @App AND h.ObjectId = @ObjectId;
                -- The share or the budget used up: there may be more.
                IF @AppCalls >= @PerApp OR @Budget = 0
                    UPDATE @Summary SET State = N'More' WHERE AppName = @App AND Calls > 0;
            END;
        END;
        EXEC sys.sp_releaseapplock @Resource = N'mailq.RunApplicationHooks', @LockOwner = N'Session';
    END TRY
    BEGIN CATCH
        -- Our own bookkeeping failed (hook errors are caught above).
        IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        IF APPLOCK_MODE(N'public', N'mailq.RunApplicationHooks', N'Session') = N'Exclusive'
            EXEC sys.sp_releaseapplock @Resource = N'mailq.RunApplicationHooks', @LockOwner = N'Session';
        THROW;
    END CATCH;
    IF @Quiet = 0
        SELECT
            s.AppName,
            s.HookProcedure,
            s.Calls,
            s.Succeeded,
            s.FailedCalls,
            s.GivenUp,
            s.CursorEventID,
            s.State
        FROM @Summary AS s
        ORDER BY s.AppName;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ListApplicationHooks: the registered hooks and where each stands
(docs/hooks.md; `mailq-db hooks list`).
Parameters:  @AppName NVARCHAR(128) = NULL: one application, NULL = all.
Result set:  one row per hook, by AppName: AppName, HookProcedure, ObjectId,
             Pinned BIT (0: changed since registration; the dispatcher suspends
             it), CursorEventID, FailingEventID, FailCount, MaxAttempts, LastError,
             LastRunAtUtc, RegisteredAtUtc, RegisteredBy, Failures INT (rows in
             mailq.ApplicationHookFailure), LastFailureAtUtc.
Errors:      none.
Transaction: opens none, writes nothing.
Isolation:   the caller's (a report).
Lock order:  mailq.ApplicationHook, then mailq.ApplicationHookFailure (shared, brief).
Example:     EXEC mailq.ListApplicationHooks;
*/
CREATE OR ALTER PROCEDURE mailq.ListApplicationHooks
    @AppName NVARCHAR(128) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- Procedures a hook may resolve to: dbo-owned schema, no other owner.
    DECLARE @Live TABLE (
        ObjectId INT NOT NULL PRIMARY KEY,
        SchemaName SYSNAME NOT NULL,
        ProcedureName SYSNAME NOT NULL
    );
    INSERT INTO @Live (ObjectId, SchemaName, ProcedureName)
    SELECT
        o.object_id AS ObjectId,
        sch.name AS SchemaName,
        o.name AS ProcedureName
    FROM sys.objects AS o
    INNER JOIN sys.schemas AS sch ON o.schema_id = sch.schema_id
    WHERE o.type = 'P' AND sch.principal_id = 1 AND COALESCE(o.principal_id, 1) = 1;
    WITH Failures AS (
        SELECT
            x.AppName,
            COUNT(*) AS Failures,
            MAX(x.RecordedAtUtc) AS LastFailureAtUtc
        FROM mailq.ApplicationHookFailure AS x
        GROUP BY x.AppName
    )

    SELECT
        h.AppName,
        CONCAT(QUOTENAME(h.SchemaName), N'.', QUOTENAME(h.ProcedureName)) AS HookProcedure,
        h.ObjectId,
        CAST(IIF(
            l.ObjectId IS NOT NULL AND HASHBYTES('SHA2_256', OBJECT_DEFINITION(h.ObjectId)) = h.DefinitionHash, 1, 0
        ) AS BIT) AS Pinned,
        h.CursorEventID,
        h.FailingEventID,
        h.FailCount,
        h.MaxAttempts,
        h.LastError,
        h.LastRunAtUtc,
        h.RegisteredAtUtc,
        h.RegisteredBy,
        COALESCE(f.Failures, 0) AS Failures,
        f.LastFailureAtUtc
    FROM mailq.ApplicationHook AS h
    LEFT JOIN @Live AS l
        ON h.ObjectId = l.ObjectId AND h.SchemaName = l.SchemaName AND h.ProcedureName = l.ProcedureName
    LEFT JOIN Failures AS f ON h.AppName = f.AppName
    WHERE @AppName IS NULL OR h.AppName = @AppName
    ORDER BY h.AppName;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetEventStreamStall: are the event stream and the hook dispatcher held back now (a
transaction that wrote a rowversion holds back MIN_ACTIVE_ROWVERSION()), and by whom?  docs/events.md.
Parameters:  @MinOpenSeconds INT 0-86400, default 0: list transactions open at least this long.
Result sets: 1. one row: HeldBack, MinActiveRowversion, NextRowversion (@@DBTS + 1), CanSeeTransactions,
                Permission (what the caller needs), OldestOpenSeconds; 2. when held back and visible:
                this database's open writing transactions, oldest first, with session and login
Permission:  EXECUTE; the DMVs are read with the caller's rights: VIEW SERVER STATE (2022: VIEW
             SERVER PERFORMANCE STATE; Azure: VIEW DATABASE STATE), else set 2 stays empty.
Errors:      50521 @MinOpenSeconds out of range.  Transaction: reads only.  Lock order: none.
Isolation:   sets READ COMMITTED; reads only DMVs.  Example: EXEC mailq.GetEventStreamStall @MinOpenSeconds = 30;
*/
CREATE OR ALTER PROCEDURE mailq.GetEventStreamStall
    @MinOpenSeconds INT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @MinOpenSeconds = COALESCE(@MinOpenSeconds, 0);
    IF @MinOpenSeconds NOT BETWEEN 0 AND 86400
    BEGIN
        SET @Msg = CONCAT(N'@MinOpenSeconds must be 0-86400 (a day); got ', @MinOpenSeconds, N'.');
        THROW 50521, @Msg, 1;
    END;
    -- @@DBTS first: a write between the two reads cannot make an idle stream look held back.
    DECLARE @Next BIGINT = CAST(@@DBTS AS BIGINT) + 1;
    DECLARE @MinActive BIGINT = CAST(MIN_ACTIVE_ROWVERSION() AS BIGINT);
    DECLARE @HeldBack BIT = IIF(@MinActive < @Next, 1, 0);
    -- HAS_PERMS_BY_NAME is NULL for a permission the server does not know (before 2022).
    DECLARE @Azure BIT = IIF(CAST(SERVERPROPERTY('EngineEdition') AS INT) = 5, 1, 0);
    DECLARE @Permission NVARCHAR(200) = IIF(
        @Azure = 1,
        N'VIEW DATABASE STATE',
        N'VIEW SERVER STATE (SQL Server 2022 and later: VIEW SERVER PERFORMANCE STATE)'
    );
    DECLARE @CanSee BIT = 0;
    IF @Azure = 1 AND HAS_PERMS_BY_NAME(DB_NAME(), N'DATABASE', N'VIEW DATABASE STATE') = 1
        SET @CanSee = 1;
    IF
        @Azure = 0
        AND (
            HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER STATE') = 1
            OR COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER PERFORMANCE STATE'), 0) = 1
        )
        SET @CanSee = 1;
    DECLARE @Holder TABLE (
        SessionID INT NULL,
        TransactionID BIGINT NOT NULL PRIMARY KEY,
        TransactionName NVARCHAR(32) NULL,
        OpenSinceUtc DATETIME2(0) NULL,
        OpenSeconds INT NULL,
        State NVARCHAR(40) NOT NULL,
        SessionStatus NVARCHAR(30) NULL,
        ProgramName NVARCHAR(128) NULL,
        HostName NVARCHAR(128) NULL,
        LoginName NVARCHAR(128) NULL,
        LogRecords BIGINT NULL
    );
    IF @HeldBack = 1 AND @CanSee = 1
    BEGIN
        -- The DMVs report local time: durations against SYSDATETIME(), start shown in UTC.
        DECLARE @LocalNow DATETIME2(3) = SYSDATETIME();
        DECLARE @UtcNow DATETIME2(3) = SYSUTCDATETIME();
        INSERT INTO @Holder (
            SessionID, TransactionID, TransactionName, OpenSinceUtc, OpenSeconds, State,
            SessionStatus, ProgramName, HostName, LoginName, LogRecords
        )
        SELECT
            st.session_id,
            dt.transaction_id,
            tx.name,
            DATEADD(SECOND, -DATEDIFF(SECOND, tx.transaction_begin_time, @LocalNow), @UtcNow),
            DATEDIFF(SECOND, tx.transaction_begin_time, @LocalNow),
            CASE
                WHEN tx.transaction_state = 5 THEN N'prepared, waiting for MSDTC (in doubt)'
                WHEN tx.transaction_state IN (7, 8) THEN N'rolling back'
                WHEN tx.transaction_type = 4 THEN N'distributed, active'
                ELSE N'active'
            END,
            s.status,
            s.program_name,
            s.host_name,
            s.login_name,
            dt.database_transaction_log_record_count
        FROM sys.dm_tran_database_transactions AS dt
        LEFT JOIN sys.dm_tran_active_transactions AS tx ON dt.transaction_id = tx.transaction_id
        OUTER APPLY (
            SELECT TOP (1) x.session_id
            FROM sys.dm_tran_session_transactions AS x
            WHERE x.transaction_id = dt.transaction_id
            ORDER BY x.session_id ASC
        ) AS st
        LEFT JOIN sys.dm_exec_sessions AS s ON st.session_id = s.session_id
        WHERE
            dt.database_id = DB_ID()
            AND dt.database_transaction_type = 1           -- read/write (not system, not read-only)
            AND dt.database_transaction_state IN (4, 5)    -- has written (log records), or prepared
            AND COALESCE(DATEDIFF(SECOND, tx.transaction_begin_time, @LocalNow), 0) >= @MinOpenSeconds;
    END;
    SELECT
        @HeldBack AS HeldBack,
        @MinActive AS MinActiveRowversion,
        @Next AS NextRowversion,
        @CanSee AS CanSeeTransactions,
        @Permission AS Permission,
        (SELECT MAX(h.OpenSeconds) FROM @Holder AS h) AS OldestOpenSeconds;
    SELECT
        h.SessionID,
        h.TransactionID,
        h.TransactionName,
        h.OpenSinceUtc,
        h.OpenSeconds,
        h.State,
        h.SessionStatus,
        h.ProgramName,
        h.HostName,
        h.LoginName,
        h.LogRecords
    FROM @Holder AS h
    ORDER BY h.OpenSeconds DESC, h.TransactionID ASC;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqEnqueuer: enqueue mail and read its events, nothing else; object-level
grants so internal procedures stay out of reach (docs/dba-guide.md, section 3).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqEnqueuer;
GRANT EXECUTE ON OBJECT::mailq.GetMailEvents TO MailqEnqueuer;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Batch enqueue: the procedure and EXECUTE on its table type (needed to pass @MailRows), for
enqueuers and for administrators (`mailq-db enqueue --batch` from an admin login).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqEnqueuer;
GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqEnqueuer;
GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqAdmin;
GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqSender (sender workers): claim, extend, release, acknowledge, read health;
no mailq.EnqueueMail: a worker's login cannot enqueue.
*/
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.AcquireLoginSlot TO MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Grants of role MailqAdmin: every public mailq procedure and the reporting views.
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ClaimMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ExtendLease TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ReleaseMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkSent TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.MarkFailed TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RequeueMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.CancelMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.PurgeMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UnblockSendingAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.BindApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UnbindApplication TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetQueueStats TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetInstallationHealth TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.QueueCountsByStatus TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.OldestDueMail TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.ThroughputPerHour TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecentFailures TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailEvents TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.StopMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.AcquireLoginSlot TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.FinalizeMail: sender workers run it on a timer; administrators may too.
*/
GRANT EXECUTE ON OBJECT::mailq.FinalizeMail TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.FinalizeMail TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Per-recipient outcomes: workers and administrators record and read them.
*/
GRANT EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.GetRecipientOutcomes TO MailqSender;
GRANT EXECUTE ON OBJECT::mailq.RecordRecipientOutcomes TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetRecipientOutcomes TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecipientOutcomes TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Hooks (docs/hooks.md): administrators run the dispatcher and list the hooks;
mailq.SetApplicationHook is db_owner's.
*/
GRANT EXECUTE ON OBJECT::mailq.RunApplicationHooks TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ListApplicationHooks TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Who may send as whom (docs/enqueue.md): administrators set and read the enqueue
policy; workers read it for `mailq-db doctor`.  mailq.EnqueueMailRows is granted to
no role (reached by ownership chaining).
*/
GRANT EXECUTE ON OBJECT::mailq.SetEnqueuePolicy TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetEnqueuePolicy TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetEnqueuePolicy TO MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetEventStreamStall for readers of the event stream; it reads the transaction
DMVs with the caller's rights (VIEW SERVER STATE, or VIEW DATABASE STATE on Azure).
*/
GRANT EXECUTE ON OBJECT::mailq.GetEventStreamStall TO MailqEnqueuer;
GRANT EXECUTE ON OBJECT::mailq.GetEventStreamStall TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailTemplate: one row per template name: latest version, description,
retirement; versions in mailq.MailTemplateVersion.  TemplateName: 1-128 letters,
digits, '.', '_', '-' (50210).
*/
IF OBJECT_ID(N'mailq.MailTemplate', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailTemplate (
        TemplateName NVARCHAR(128) NOT NULL,
        LatestVersion INT NOT NULL,
        Description NVARCHAR(400) NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_MailTemplate_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        RetiredAtUtc DATETIME2(3) NULL,
        RetiredBy NVARCHAR(128) NULL,
        RetiredReason NVARCHAR(400) NULL,
        CONSTRAINT PK_MailTemplate PRIMARY KEY CLUSTERED (TemplateName),
        CONSTRAINT CK_MailTemplate_LatestVersion CHECK (LatestVersion >= 1)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.MailTemplateVersion: the immutable versions of each template (1, 2, 3 ...;
trg_MailTemplateVersion_Immutable refuses changes, 50218): a pinned mail renders
the same text again.  CreatedBy: SUSER_SNAME() (survives a dropped user).
*/
IF OBJECT_ID(N'mailq.MailTemplateVersion', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.MailTemplateVersion (
        TemplateName NVARCHAR(128) NOT NULL,
        Version INT NOT NULL,
        SubjectTemplate NVARCHAR(4000) NOT NULL,
        HtmlTemplate NVARCHAR(MAX) NULL,
        TextTemplate NVARCHAR(MAX) NULL,
        CreatedBy NVARCHAR(128) NOT NULL
        CONSTRAINT DF_MailTemplateVersion_CreatedBy DEFAULT (SUSER_SNAME()),
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_MailTemplateVersion_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_MailTemplateVersion PRIMARY KEY CLUSTERED (TemplateName, Version),
        CONSTRAINT FK_MailTemplateVersion_MailTemplate FOREIGN KEY (TemplateName)
        REFERENCES mailq.MailTemplate (TemplateName),
        CONSTRAINT CK_MailTemplateVersion_Version CHECK (Version >= 1),
        CONSTRAINT CK_MailTemplateVersion_Body CHECK (HtmlTemplate IS NOT NULL OR TextTemplate IS NOT NULL),
        CONSTRAINT CK_MailTemplateVersion_Size CHECK (
            LEN(SubjectTemplate) >= 1
            AND (HtmlTemplate IS NULL OR LEN(HtmlTemplate) <= 2000000)
            AND (TextTemplate IS NULL OR LEN(TextTemplate) <= 2000000)
        )
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.trg_MailTemplateVersion_Immutable: refuses any UPDATE or DELETE of a template
version with 50218 (rolls back the statement's transaction), also for db_owner;
TRUNCATE and DROP do not fire it.  The foreign key must stay NO ACTION.
*/
CREATE OR ALTER TRIGGER mailq.trg_MailTemplateVersion_Immutable
ON mailq.MailTemplateVersion
INSTEAD OF UPDATE, DELETE
AS
BEGIN
    SET NOCOUNT ON;
    IF NOT EXISTS (SELECT 1 FROM deleted)
        RETURN;
    DECLARE @Msg NVARCHAR(2048) = CONCAT(
        N'mailq.MailTemplateVersion rows are immutable: add a new version with mailq.AddMailTemplateVersion, ',
        N'or retire the template with mailq.RetireMailTemplate.'
    );
    THROW 50218, @Msg, 1;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.AddMailTemplateVersion: stores a new, never-changing version of a mail template (1 for a new
name); texts byte-equal to the latest add nothing (@Created 0), so redeploying is harmless.
Parameters:  @TemplateName NVARCHAR(128) (A-Z a-z 0-9 . _ -), @SubjectTemplate (1-4000), required;
             @HtmlTemplate, @TextTemplate: at least one, up to 2,000,000 characters; @Description NVARCHAR(400)
             (NULL keeps it); @ExpectedLatestVersion INT (0: a new name); @Version, @Created OUTPUT
Errors:      50210 @TemplateName; 50211 @SubjectTemplate; 50212 no body or too long; 50213 @Description;
             50214 @ExpectedLatestVersion < 0; 50216 retired; 50217 latest is not @ExpectedLatestVersion.
Transaction: its own if none is open, else the caller's; an error dooms it (XACT_ABORT ON).
Isolation:   sets READ COMMITTED.  Lock order: mailq.MailTemplate (UPDLOCK, HOLDLOCK: versions
             are numbered one at a time per name), then mailq.MailTemplateVersion.
Example:     EXEC mailq.AddMailTemplateVersion @TemplateName = N'hi', @SubjectTemplate = N'Hi', @TextTemplate = N'Hi';
*/
CREATE OR ALTER PROCEDURE mailq.AddMailTemplateVersion
    @TemplateName NVARCHAR(4000),
    @SubjectTemplate NVARCHAR(MAX),
    @HtmlTemplate NVARCHAR(MAX) = NULL,
    @TextTemplate NVARCHAR(MAX) = NULL,
    @Description NVARCHAR(4000) = NULL,
    @ExpectedLatestVersion INT = NULL,
    @Version INT = NULL OUTPUT,
    @Created BIT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SELECT @Version = NULL, @Created = 0;
    -- Name rule under a binary collation: a linguistic [A-Z] matches accented letters.
    IF NULLIF(@TemplateName, N'') IS NULL
        OR LEN(@TemplateName) > 128
        OR DATALENGTH(@TemplateName) <> 2 * LEN(@TemplateName)
        OR @TemplateName COLLATE Latin1_General_BIN2 LIKE N'%[^A-Za-z0-9._-]%'
    BEGIN
        SET @Msg = CONCAT(N'@TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ -; got ',
                          IIF(@TemplateName IS NULL, N'NULL', QUOTENAME(LEFT(@TemplateName, 200), N'''')), N'.');
        THROW 50210, @Msg, 1;
    END;
    IF NULLIF(@SubjectTemplate, N'') IS NULL OR LEN(@SubjectTemplate) > 4000
    BEGIN
        SET @Msg = CONCAT(N'@SubjectTemplate is required and limited to 4000 characters; got ',
                          IIF(@SubjectTemplate IS NULL, N'NULL', CONCAT(LEN(@SubjectTemplate), N' characters')), N'.');
        THROW 50211, @Msg, 1;
    END;
    SELECT @HtmlTemplate = NULLIF(@HtmlTemplate, N''), @TextTemplate = NULLIF(@TextTemplate, N'');
    IF @HtmlTemplate IS NULL AND @TextTemplate IS NULL
        THROW 50212, N'Give @HtmlTemplate, @TextTemplate or both: a template needs a body.', 1;
    IF LEN(@HtmlTemplate) > 2000000 OR LEN(@TextTemplate) > 2000000
    BEGIN
        SET @Msg = CONCAT(N'@HtmlTemplate and @TextTemplate are limited to 2,000,000 characters each ',
                          N'(EnqueueMail''s body limit).');
        THROW 50212, @Msg, 1;
    END;
    IF LEN(@Description) > 400
        THROW 50213, N'@Description is limited to 400 characters.', 1;
    IF @ExpectedLatestVersion < 0
    BEGIN
        SET @Msg = CONCAT(N'@ExpectedLatestVersion must be 0 (a new name) or a version number; got ',
                          @ExpectedLatestVersion, N'.');
        THROW 50214, @Msg, 1;
    END;
    DECLARE @Latest INT, @RetiredAtUtc DATETIME2(3);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        SELECT
            @Latest = t.LatestVersion,
            @RetiredAtUtc = t.RetiredAtUtc
        FROM mailq.MailTemplate AS t WITH (UPDLOCK, HOLDLOCK)
        WHERE t.TemplateName = @TemplateName;
        IF @ExpectedLatestVersion IS NOT NULL AND ISNULL(@Latest, 0) <> @ExpectedLatestVersion
        BEGIN
            SET @Msg = CONCAT(N'Template ', QUOTENAME(@TemplateName, N''''), N' is at version ',
                              ISNULL(@Latest, 0), N', not @ExpectedLatestVersion ', @ExpectedLatestVersion,
                              N': someone else added a version; read it and try again.');
            THROW 50217, @Msg, 1;
        END;
        IF @RetiredAtUtc IS NOT NULL
        BEGIN
            SET @Msg = CONCAT(N'Template ', QUOTENAME(@TemplateName, N''''),
                              N' is retired; mailq.RetireMailTemplate @Retire = 0 brings it back.');
            THROW 50216, @Msg, 1;
        END;
        -- VARBINARY compares bytes: a case-only change is a new version.
        IF EXISTS (
            SELECT 1
            FROM mailq.MailTemplateVersion AS v
            WHERE v.TemplateName = @TemplateName
                AND v.Version = @Latest
                AND CAST(v.SubjectTemplate AS VARBINARY(MAX)) = CAST(@SubjectTemplate AS VARBINARY(MAX))
                AND (
                    (v.HtmlTemplate IS NULL AND @HtmlTemplate IS NULL)
                    OR CAST(v.HtmlTemplate AS VARBINARY(MAX)) = CAST(@HtmlTemplate AS VARBINARY(MAX))
                )
                AND (
                    (v.TextTemplate IS NULL AND @TextTemplate IS NULL)
                    OR CAST(v.TextTemplate AS VARBINARY(MAX)) = CAST(@TextTemplate AS VARBINARY(MAX))
                )
        )
        BEGIN
            SET @Version = @Latest;
            IF @Description IS NOT NULL
                UPDATE t
                SET t.Description = @Description
                FROM mailq.MailTemplate AS t
                WHERE t.TemplateName = @TemplateName;
        END;
        ELSE
        BEGIN
            SET @Version = ISNULL(@Latest, 0) + 1;
            IF @Latest IS NULL
                INSERT INTO mailq.MailTemplate (TemplateName, LatestVersion, Description)
                VALUES (@TemplateName, @Version, @Description);
            ELSE
                UPDATE t
                SET
                    t.LatestVersion = @Version,
                    t.Description = ISNULL(@Description, t.Description)
                FROM mailq.MailTemplate AS t
                WHERE t.TemplateName = @TemplateName;
            INSERT INTO mailq.MailTemplateVersion (
                TemplateName, Version, SubjectTemplate, HtmlTemplate, TextTemplate
            )
            VALUES (@TemplateName, @Version, @SubjectTemplate, @HtmlTemplate, @TextTemplate);
            SET @Created = 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        SELECT @Version = NULL, @Created = 0;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetMailTemplate: one version of a mail template, for rendering or review: without
@Version the latest (50216 when retired), with @Version that one even if retired.
Parameters:  @TemplateName NVARCHAR(128), required; @Version INT, optional (>= 1).
Result set:  one row: the version's texts, LatestVersion, Description, CreatedBy, CreatedAtUtc, RetiredAtUtc.
Errors:      50210 @TemplateName missing or invalid; 50214 @Version below 1; 50215 no such
             template or version; 50216 retired (no @Version).
Transaction: reads only.  Isolation: the caller's (a version row never changes).
Lock order:  mailq.MailTemplate, then mailq.MailTemplateVersion.
Example:     EXEC mailq.GetMailTemplate @TemplateName = N'welcome', @Version = 2;
*/
CREATE OR ALTER PROCEDURE mailq.GetMailTemplate
    @TemplateName NVARCHAR(4000),
    @Version INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(@TemplateName, N'') IS NULL OR LEN(@TemplateName) > 128
    BEGIN
        SET @Msg = CONCAT(N'@TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ -; got ',
                          IIF(@TemplateName IS NULL, N'NULL', QUOTENAME(LEFT(@TemplateName, 200), N'''')), N'.');
        THROW 50210, @Msg, 1;
    END;
    IF @Version < 1
    BEGIN
        SET @Msg = CONCAT(N'@Version must be 1 or more (NULL: the latest); got ', @Version, N'.');
        THROW 50214, @Msg, 1;
    END;
    DECLARE @Latest INT, @RetiredAtUtc DATETIME2(3);
    SELECT
        @Latest = t.LatestVersion,
        @RetiredAtUtc = t.RetiredAtUtc
    FROM mailq.MailTemplate AS t
    WHERE t.TemplateName = @TemplateName;
    IF @Latest IS NULL
    BEGIN
        SET @Msg = CONCAT(N'No template is named ', QUOTENAME(LEFT(@TemplateName, 128), N''''),
                          N' (mailq.ListMailTemplates lists them).');
        THROW 50215, @Msg, 1;
    END;
    IF @Version IS NULL AND @RetiredAtUtc IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(N'Template ', QUOTENAME(@TemplateName, N''''), N' is retired since ',
                          CONVERT(NVARCHAR(30), @RetiredAtUtc, 126),
                          N' UTC: new mail cannot use it (a given @Version still reads).');
        THROW 50216, @Msg, 1;
    END;
    IF @Version > @Latest
    BEGIN
        SET @Msg = CONCAT(N'Template ', QUOTENAME(@TemplateName, N''''), N' has no version ', @Version,
                          N'; its latest is ', @Latest, N'.');
        THROW 50215, @Msg, 1;
    END;
    SELECT
        v.TemplateName,
        v.Version,
        t.LatestVersion,
        v.SubjectTemplate,
        v.HtmlTemplate,
        v.TextTemplate,
        t.Description,
        v.CreatedBy,
        v.CreatedAtUtc,
        t.RetiredAtUtc
    FROM mailq.MailTemplate AS t
    INNER JOIN mailq.MailTemplateVersion AS v
        ON t.TemplateName = v.TemplateName
    WHERE
        t.TemplateName = @TemplateName
        AND v.Version = ISNULL(@Version, @Latest);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ListMailTemplates: the mail templates, one row per name, in name order.
Parameters:  @IncludeRetired BIT, default 0: 1 lists retired templates too.
Result set:  TemplateName, LatestVersion, Description, CreatedAtUtc,
             LatestVersionCreatedAtUtc, LatestVersionCreatedBy, RetiredAtUtc,
             RetiredBy, RetiredReason.
Errors:      none.
Transaction: reads only; none of its own.
Isolation:   the caller's; one seek per template for its latest version.
Lock order:  mailq.MailTemplate, then mailq.MailTemplateVersion.
Example:     EXEC mailq.ListMailTemplates @IncludeRetired = 1;
*/
CREATE OR ALTER PROCEDURE mailq.ListMailTemplates
    @IncludeRetired BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SELECT
        t.TemplateName,
        t.LatestVersion,
        t.Description,
        t.CreatedAtUtc,
        v.CreatedAtUtc AS LatestVersionCreatedAtUtc,
        v.CreatedBy AS LatestVersionCreatedBy,
        t.RetiredAtUtc,
        t.RetiredBy,
        t.RetiredReason
    FROM mailq.MailTemplate AS t
    INNER JOIN mailq.MailTemplateVersion AS v
        ON t.TemplateName = v.TemplateName AND t.LatestVersion = v.Version
    WHERE t.RetiredAtUtc IS NULL OR ISNULL(@IncludeRetired, 0) = 1
    ORDER BY t.TemplateName;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ListMailTemplateVersions: the versions of one mail template, newest
first, without their bodies (mailq.GetMailTemplate @Version reads one).
Parameters:  @TemplateName NVARCHAR(128), required.
Result set:  one row per version: TemplateName, Version, SubjectTemplate, HtmlChars,
             TextChars (NULL when that body is absent), CreatedBy, CreatedAtUtc.
Errors:      50210 @TemplateName missing or invalid; 50215 no template has this name.
Transaction: reads only; none of its own.
Isolation:   the caller's (a seek on the primary key's leading column).
Lock order:  mailq.MailTemplate, then mailq.MailTemplateVersion (shared).
Example:     EXEC mailq.ListMailTemplateVersions @TemplateName = N'welcome';
*/
CREATE OR ALTER PROCEDURE mailq.ListMailTemplateVersions
    @TemplateName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(@TemplateName, N'') IS NULL OR LEN(@TemplateName) > 128
    BEGIN
        SET @Msg = CONCAT(N'@TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ -; got ',
                          IIF(@TemplateName IS NULL, N'NULL', QUOTENAME(LEFT(@TemplateName, 200), N'''')), N'.');
        THROW 50210, @Msg, 1;
    END;
    IF NOT EXISTS (SELECT 1 FROM mailq.MailTemplate AS t WHERE t.TemplateName = @TemplateName)
    BEGIN
        SET @Msg = CONCAT(N'No template is named ', QUOTENAME(LEFT(@TemplateName, 128), N''''),
                          N' (mailq.ListMailTemplates lists them).');
        THROW 50215, @Msg, 1;
    END;
    SELECT
        v.TemplateName,
        v.Version,
        v.SubjectTemplate,
        LEN(v.HtmlTemplate) AS HtmlChars,
        LEN(v.TextTemplate) AS TextChars,
        v.CreatedBy,
        v.CreatedAtUtc
    FROM mailq.MailTemplateVersion AS v
    WHERE v.TemplateName = @TemplateName
    ORDER BY v.Version DESC;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RetireMailTemplate: retires a mail template (new mail may not use it: 50216)
or brings it back (@Retire = 0).  Its versions stay: pinned mail still renders.
Retiring a retired template changes nothing (Changed = 0).
Parameters:  @TemplateName NVARCHAR(128), required; @Retire BIT = 1; @Reason NVARCHAR(400)
Result set:  one row: TemplateName, LatestVersion, RetiredAtUtc, RetiredBy,
             RetiredReason, Changed BIT.
Errors:      50210 @TemplateName missing or invalid; 50213 @Reason too long; 50215 unknown.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here; one UPDATE of one row by key.
Lock order:  mailq.MailTemplate only.
Example:     EXEC mailq.RetireMailTemplate @TemplateName = N'welcome', @Reason = N'replaced';
*/
CREATE OR ALTER PROCEDURE mailq.RetireMailTemplate
    @TemplateName NVARCHAR(4000),
    @Retire BIT = 1,
    @Reason NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(@TemplateName, N'') IS NULL OR LEN(@TemplateName) > 128
    BEGIN
        SET @Msg = CONCAT(N'@TemplateName must be 1-128 characters of A-Z a-z 0-9 . _ -; got ',
                          IIF(@TemplateName IS NULL, N'NULL', QUOTENAME(LEFT(@TemplateName, 200), N'''')), N'.');
        THROW 50210, @Msg, 1;
    END;
    IF LEN(@Reason) > 400
        THROW 50213, N'@Reason is limited to 400 characters.', 1;
    SET @Retire = ISNULL(@Retire, 1);
    DECLARE @Changed TABLE (
        TemplateName NVARCHAR(128) NOT NULL,
        LatestVersion INT NOT NULL,
        RetiredAtUtc DATETIME2(3) NULL,
        RetiredBy NVARCHAR(128) NULL,
        RetiredReason NVARCHAR(400) NULL
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        UPDATE t
        SET
            t.RetiredAtUtc = IIF(@Retire = 1, SYSUTCDATETIME(), NULL),
            t.RetiredBy = IIF(@Retire = 1, SUSER_SNAME(), NULL),
            t.RetiredReason = IIF(@Retire = 1, @Reason, NULL)
        OUTPUT inserted.TemplateName, inserted.LatestVersion, inserted.RetiredAtUtc,
            inserted.RetiredBy, inserted.RetiredReason
        INTO @Changed (TemplateName, LatestVersion, RetiredAtUtc, RetiredBy, RetiredReason)
        FROM mailq.MailTemplate AS t
        WHERE
            t.TemplateName = @TemplateName
            AND ((@Retire = 1 AND t.RetiredAtUtc IS NULL) OR (@Retire = 0 AND t.RetiredAtUtc IS NOT NULL));
        IF NOT EXISTS (SELECT 1 FROM @Changed)
            AND NOT EXISTS (SELECT 1 FROM mailq.MailTemplate AS t WHERE t.TemplateName = @TemplateName)
        BEGIN
            SET @Msg = CONCAT(N'No template is named ', QUOTENAME(LEFT(@TemplateName, 128), N''''),
                              N' (mailq.ListMailTemplates lists them).');
            THROW 50215, @Msg, 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        c.TemplateName,
        c.LatestVersion,
        c.RetiredAtUtc,
        c.RetiredBy,
        c.RetiredReason,
        CAST(1 AS BIT) AS Changed
    FROM @Changed AS c
    UNION ALL
    SELECT
        t.TemplateName,
        t.LatestVersion,
        t.RetiredAtUtc,
        t.RetiredBy,
        t.RetiredReason,
        CAST(0 AS BIT) AS Changed
    FROM mailq.MailTemplate AS t
    WHERE t.TemplateName = @TemplateName AND NOT EXISTS (SELECT 1 FROM @Changed);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Mail templates: administrators manage and read them; workers read them.
*/
GRANT EXECUTE ON OBJECT::mailq.AddMailTemplateVersion TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailTemplate TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ListMailTemplates TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ListMailTemplateVersions TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RetireMailTemplate TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailTemplate TO MailqSender;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqDbMailUser: Database Mail callers (msdb's DatabaseMailUserRole): may
call mailq.SendDbMail and read the sysmail_* views (their own mail only); its own
role because SendDbMail runs a caller's @query (with the caller's own rights).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqDbMailUser') IS NULL
    CREATE ROLE MailqDbMailUser AUTHORIZATION dbo;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.DbMailProfile: a Database Mail profile (msdb.dbo.sysmail_profile): an ordered
list of sending accounts (mailq.DbMailProfileAccount); ProfileID is the profile_id
the sysmail_* views show.
*/
IF OBJECT_ID(N'mailq.DbMailProfile', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailProfile (
        ProfileID INT IDENTITY (1, 1) NOT NULL,
        ProfileName NVARCHAR(128) NOT NULL,
        Description NVARCHAR(256) NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_DbMailProfile_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_DbMailProfile PRIMARY KEY CLUSTERED (ProfileID),
        CONSTRAINT UQ_DbMailProfile_ProfileName UNIQUE (ProfileName)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.DbMailAccount: the INT account_id the sysmail_* views show for a sending
account, made when first added to a profile, never reused.
*/
IF OBJECT_ID(N'mailq.DbMailAccount', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailAccount (
        AccountID INT IDENTITY (1, 1) NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        CONSTRAINT PK_DbMailAccount PRIMARY KEY CLUSTERED (AccountID),
        CONSTRAINT UQ_DbMailAccount_AccountName UNIQUE (AccountName),
        CONSTRAINT FK_DbMailAccount_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.DbMailProfileAccount: a profile's accounts in failover order (lowest
SequenceNumber first); SendDbMail picks the first not blocked at enqueue.
*/
IF OBJECT_ID(N'mailq.DbMailProfileAccount', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailProfileAccount (
        ProfileID INT NOT NULL,
        AccountID INT NOT NULL,
        SequenceNumber INT NOT NULL,
        CONSTRAINT PK_DbMailProfileAccount PRIMARY KEY CLUSTERED (ProfileID, AccountID),
        CONSTRAINT FK_DbMailProfileAccount_DbMailProfile FOREIGN KEY (ProfileID)
        REFERENCES mailq.DbMailProfile (ProfileID),
        CONSTRAINT FK_DbMailProfileAccount_DbMailAccount FOREIGN KEY (AccountID)
        REFERENCES mailq.DbMailAccount (AccountID),
        CONSTRAINT CK_DbMailProfileAccount_SequenceNumber CHECK (SequenceNumber >= 0)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.DbMailPrincipalProfile: who may use a profile (a user, a role or N'public')
and each principal's default (IsDefault, at most one).
*/
IF OBJECT_ID(N'mailq.DbMailPrincipalProfile', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailPrincipalProfile (
        PrincipalName NVARCHAR(128) NOT NULL,
        ProfileID INT NOT NULL,
        IsDefault BIT NOT NULL CONSTRAINT DF_DbMailPrincipalProfile_IsDefault DEFAULT (0),
        CONSTRAINT PK_DbMailPrincipalProfile PRIMARY KEY CLUSTERED (PrincipalName, ProfileID),
        CONSTRAINT FK_DbMailPrincipalProfile_DbMailProfile FOREIGN KEY (ProfileID)
        REFERENCES mailq.DbMailProfile (ProfileID)
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.DbMailItem: one row per mailq.SendDbMail call: msdb's mail item fields the
queue does not hold.  MailID: the mail (ON DELETE CASCADE); ProfileID has no
foreign key (the mail outlives its profile, as in msdb).
SendRequestDate  the server's local time (DATETIME, as msdb), indexed.
RequestUser, RequestUserSid  whose rights the query runs with (docs/database-mail.md).
QueryState    NULL (no query), Pending, Running, Done, Failed; QueryDueAtUtc: when a
              runner may take it (Pending: at once; Running: the lease expiry).
*/
IF OBJECT_ID(N'mailq.DbMailItem', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailItem (
        MailItemID INT IDENTITY (1, 1) NOT NULL,
        MailID BIGINT NOT NULL,
        ProfileID INT NOT NULL,
        Importance VARCHAR(6) NOT NULL,
        Sensitivity VARCHAR(12) NOT NULL,
        Query NVARCHAR(MAX) NULL,
        ExecuteQueryDatabase NVARCHAR(128) NULL,
        AttachQueryResultAsFile BIT NOT NULL,
        QueryAttachmentFilename NVARCHAR(260) NULL,
        QueryResultHeader BIT NOT NULL,
        QueryResultWidth INT NOT NULL,
        QueryResultSeparator NCHAR(1) NOT NULL,
        ExcludeQueryOutput BIT NOT NULL,
        AppendQueryError BIT NOT NULL,
        QueryNoTruncate BIT NOT NULL CONSTRAINT DF_DbMailItem_QueryNoTruncate DEFAULT (0),
        QueryResultNoPadding BIT NOT NULL CONSTRAINT DF_DbMailItem_QueryResultNoPadding DEFAULT (0),
        QueryResultFormat VARCHAR(4) NOT NULL CONSTRAINT DF_DbMailItem_QueryResultFormat DEFAULT ('TEXT'),
        SendRequestUser NVARCHAR(128) NOT NULL,
        SendRequestDate DATETIME NOT NULL,
        RequestUser NVARCHAR(128) NOT NULL,
        RequestUserSid VARBINARY(85) NULL,
        QueryState NVARCHAR(16) NULL,
        QueryDueAtUtc DATETIME2(3) NULL,
        QueryLockToken UNIQUEIDENTIFIER NULL,
        QueryAttempts INT NOT NULL CONSTRAINT DF_DbMailItem_QueryAttempts DEFAULT (0),
        QueryError NVARCHAR(4000) NULL,
        QueryFinishedAtUtc DATETIME2(3) NULL,
        CONSTRAINT PK_DbMailItem PRIMARY KEY CLUSTERED (MailItemID),
        CONSTRAINT UQ_DbMailItem_MailID UNIQUE (MailID),
        CONSTRAINT FK_DbMailItem_MailQueue FOREIGN KEY (MailID)
        REFERENCES mailq.MailQueue (ID) ON DELETE CASCADE,
        CONSTRAINT CK_DbMailItem_QueryState CHECK (
            (QueryState IS NULL AND Query IS NULL)
            OR (QueryState IN (N'Pending', N'Running', N'Done', N'Failed') AND Query IS NOT NULL)
        ),
        CONSTRAINT CK_DbMailItem_QueryLease CHECK (
            (QueryState = N'Running' AND QueryLockToken IS NOT NULL AND QueryDueAtUtc IS NOT NULL)
            OR (QueryState = N'Pending' AND QueryLockToken IS NULL AND QueryDueAtUtc IS NOT NULL)
            OR (QueryState IS NULL OR QueryState IN (N'Done', N'Failed'))
        ),
        CONSTRAINT CK_DbMailItem_QueryResultFormat CHECK (QueryResultFormat IN ('TEXT', 'HTML', 'CSV'))
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_DbMailItem_SendRequestDate: the sysmail_* views' send_request_date filter as a seek.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_DbMailItem_SendRequestDate' AND object_id = OBJECT_ID(N'mailq.DbMailItem')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_DbMailItem_SendRequestDate
    ON mailq.DbMailItem (SendRequestDate)
    INCLUDE (MailID);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
IX_DbMailItem_QueryDue: the queries a runner may take (mailq.ClaimDbMailQuery), one
range on QueryDueAtUtc; filtered, so finished items cost nothing.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_DbMailItem_QueryDue' AND object_id = OBJECT_ID(N'mailq.DbMailItem')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_DbMailItem_QueryDue
    ON mailq.DbMailItem (QueryDueAtUtc, MailItemID)
    INCLUDE (QueryState)
    WHERE QueryState IN (N'Pending', N'Running');
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
UX_DbMailPrincipalProfile_Default: at most one default profile per principal.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE
        name = N'UX_DbMailPrincipalProfile_Default'
        AND object_id = OBJECT_ID(N'mailq.DbMailPrincipalProfile')
)
BEGIN
    CREATE UNIQUE NONCLUSTERED INDEX UX_DbMailPrincipalProfile_Default
    ON mailq.DbMailPrincipalProfile (PrincipalName)
    WHERE IsDefault = 1;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_allitems: msdb.dbo.sysmail_allitems over this queue: one row per
mailq.SendDbMail call, msdb's 27 columns in msdb's order, text as Unicode
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-allitems-transact-sql).
Rows:        db_owner and MailqAdmin members see all; others what they sent.
Mapping:     sent_status: Sent -> sent; Failed, Cancelled, Expired, Stopped ->
             failed; UnSent or Sending after a failed attempt -> retrying; else
             unsent.  sent_date and last_mod_date: UTC plus the server's current
             offset.  recipients NULL for Cc/Bcc-only mail; file_attachments NULL.
Cost:        mailitem_id and send_request_date filters seek DbMailItem; others
             read the DbMail items only (tests/integration/test_dbmail_views_plan.py).
*/
CREATE OR ALTER VIEW mailq.sysmail_allitems
AS
-- The server's current offset from UTC (0 on Azure SQL Database).
WITH Clock AS (
    SELECT DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()) AS OffsetMinutes
)

SELECT
    i.MailItemID AS mailitem_id,
    i.ProfileID AS profile_id,
    NULLIF(q.ToAddress, N'') AS recipients,
    q.CC AS copy_recipients,
    q.BCC AS blind_copy_recipients,
    CAST(q.Subject AS NVARCHAR(900)) AS subject,
    CAST(q.Body AS NVARCHAR(MAX)) AS body,
    CAST(UPPER(q.BodyFormat) AS NVARCHAR(20)) AS body_format,
    CAST(i.Importance AS NVARCHAR(6)) AS importance,
    CAST(i.Sensitivity AS NVARCHAR(12)) AS sensitivity,
    CAST(NULL AS NVARCHAR(MAX)) AS file_attachments,
    CAST(N'MIME' AS NVARCHAR(20)) AS attachment_encoding,
    CAST(i.Query AS NVARCHAR(MAX)) AS query,
    CAST(i.ExecuteQueryDatabase AS SYSNAME) AS execute_query_database,
    i.AttachQueryResultAsFile AS attach_query_result_as_file,
    i.QueryResultHeader AS query_result_header,
    i.QueryResultWidth AS query_result_width,
    i.QueryResultSeparator AS query_result_separator,
    i.ExcludeQueryOutput AS exclude_query_output,
    i.AppendQueryError AS append_query_error,
    i.SendRequestDate AS send_request_date,
    CAST(i.SendRequestUser AS SYSNAME) AS send_request_user,
    IIF(q.Status = N'Sent', da.AccountID, NULL) AS sent_account_id,
    CAST(
        CASE
            WHEN q.Status = N'Sent' THEN N'sent'
            WHEN q.Status IN (N'Failed', N'Cancelled', N'Expired', N'Stopped') THEN N'failed'
            WHEN q.AttemptCount > 0 AND q.LastError IS NOT NULL THEN N'retrying'
            ELSE N'unsent'
        END AS NVARCHAR(8)
    ) AS sent_status,
    CAST(
        IIF(
            q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped'),
            DATEADD(MINUTE, k.OffsetMinutes, COALESCE(q.SentAtUtc, q.DateProcessed)),
            NULL
        ) AS DATETIME
    ) AS sent_date,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, COALESCE(q.DateProcessed, q.dtStamp)) AS DATETIME) AS last_mod_date,
    CAST(i.SendRequestUser AS SYSNAME) AS last_mod_user
FROM mailq.DbMailItem AS i
INNER JOIN mailq.MailQueue AS q ON i.MailID = q.ID
CROSS JOIN Clock AS k
LEFT JOIN mailq.DbMailAccount AS da ON q.AccountName = da.AccountName
WHERE
    IS_MEMBER(N'db_owner') = 1
    OR IS_MEMBER(N'MailqAdmin') = 1
    OR i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME());
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_sentitems: msdb.dbo.sysmail_sentitems over this queue: the rows of
mailq.sysmail_allitems whose sent_status is sent, with the same columns
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-sentitems-transact-sql).
*/
CREATE OR ALTER VIEW mailq.sysmail_sentitems
AS
SELECT
    i.mailitem_id,
    i.profile_id,
    i.recipients,
    i.copy_recipients,
    i.blind_copy_recipients,
    i.subject,
    i.body,
    i.body_format,
    i.importance,
    i.sensitivity,
    i.file_attachments,
    i.attachment_encoding,
    i.query,
    i.execute_query_database,
    i.attach_query_result_as_file,
    i.query_result_header,
    i.query_result_width,
    i.query_result_separator,
    i.exclude_query_output,
    i.append_query_error,
    i.send_request_date,
    i.send_request_user,
    i.sent_account_id,
    i.sent_status,
    i.sent_date,
    i.last_mod_date,
    i.last_mod_user
FROM mailq.sysmail_allitems AS i
WHERE i.sent_status = 'sent';
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_unsentitems: msdb.dbo.sysmail_unsentitems over this queue: the rows of
mailq.sysmail_allitems whose sent_status is unsent or retrying (as msdb's view)
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-unsentitems-transact-sql).
*/
CREATE OR ALTER VIEW mailq.sysmail_unsentitems
AS
SELECT
    i.mailitem_id,
    i.profile_id,
    i.recipients,
    i.copy_recipients,
    i.blind_copy_recipients,
    i.subject,
    i.body,
    i.body_format,
    i.importance,
    i.sensitivity,
    i.file_attachments,
    i.attachment_encoding,
    i.query,
    i.execute_query_database,
    i.attach_query_result_as_file,
    i.query_result_header,
    i.query_result_width,
    i.query_result_separator,
    i.exclude_query_output,
    i.append_query_error,
    i.send_request_date,
    i.send_request_user,
    i.sent_account_id,
    i.sent_status,
    i.sent_date,
    i.last_mod_date,
    i.last_mod_user
FROM mailq.sysmail_allitems AS i
WHERE i.sent_status IN ('unsent', 'retrying');
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_faileditems: msdb.dbo.sysmail_faileditems over this queue: the rows of
mailq.sysmail_allitems whose sent_status is failed, with the same columns
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-faileditems-transact-sql).
*/
CREATE OR ALTER VIEW mailq.sysmail_faileditems
AS
SELECT
    i.mailitem_id,
    i.profile_id,
    i.recipients,
    i.copy_recipients,
    i.blind_copy_recipients,
    i.subject,
    i.body,
    i.body_format,
    i.importance,
    i.sensitivity,
    i.file_attachments,
    i.attachment_encoding,
    i.query,
    i.execute_query_database,
    i.attach_query_result_as_file,
    i.query_result_header,
    i.query_result_width,
    i.query_result_separator,
    i.exclude_query_output,
    i.append_query_error,
    i.send_request_date,
    i.send_request_user,
    i.sent_account_id,
    i.sent_status,
    i.sent_date,
    i.last_mod_date,
    i.last_mod_user
FROM mailq.sysmail_allitems AS i
WHERE i.sent_status = 'failed';
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_event_log: msdb.dbo.sysmail_event_log over mailq.MailEvent for mail
sent with mailq.SendDbMail, msdb's columns in msdb's order
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-event-log-transact-sql).
event_type:  success: Sent, DryRun; warning: RetryScheduled, AccountWaiting,
             LeaseExpired, Released; error: Failed, Expired, Stopped by a failed
             query (one error row per finally failed mail, as msdb); information:
             Cancelled, Requeued, other Stopped.
log_id:      the EventID (BIGINT), in commit order: "log_id > @last_seen" polling
             works (docs/events.md).
Rows:        as mailq.sysmail_allitems.  Cost: a seek per item on IX_MailEvent_MailID.
*/
CREATE OR ALTER VIEW mailq.sysmail_event_log
AS
WITH Clock AS (
    SELECT DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()) AS OffsetMinutes
)

SELECT
    CAST(e.EventSeq AS BIGINT) AS log_id,
    CAST(
        CASE
            WHEN e.EventType IN (N'Sent', N'DryRun') THEN N'success'
            WHEN e.EventType IN (N'Failed', N'Expired') THEN N'error'
            WHEN e.EventType = N'Stopped' AND i.QueryState = N'Failed' THEN N'error'
            WHEN e.EventType IN (N'Cancelled', N'Requeued', N'Stopped') THEN N'information'
            ELSE N'warning'
        END AS NVARCHAR(11)
    ) AS event_type,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, e.OccurredAtUtc) AS DATETIME) AS log_date,
    CAST(
        CONCAT(
            e.EventType,
            IIF(e.SmtpCode IS NULL, N'', CONCAT(N' (SMTP ', e.SmtpCode, N')')),
            IIF(e.Detail IS NULL, N'', CONCAT(N': ', e.Detail))
        ) AS NVARCHAR(MAX)
    ) AS description,
    CAST(NULL AS INT) AS process_id,
    i.MailItemID AS mailitem_id,
    da.AccountID AS account_id,
    CAST(DATEADD(MINUTE, k.OffsetMinutes, e.OccurredAtUtc) AS DATETIME) AS last_mod_date,
    CAST(i.SendRequestUser AS SYSNAME) AS last_mod_user
FROM mailq.DbMailItem AS i
INNER JOIN mailq.MailEvent AS e ON i.MailID = e.MailID
INNER JOIN mailq.MailQueue AS q ON i.MailID = q.ID
CROSS JOIN Clock AS k
LEFT JOIN mailq.DbMailAccount AS da ON q.AccountName = da.AccountName
WHERE
    e.EventType NOT IN (N'Enqueued', N'Claimed')
    AND (
        IS_MEMBER(N'db_owner') = 1
        OR IS_MEMBER(N'MailqAdmin') = 1
        OR i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME())
    );
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.DbMailAddressProblem: the first thing wrong with a mailq.SendDbMail call's
addresses, named with sp_send_dbmail's parameters, or no row.
Parameters:  @recipients, @copy_recipients, @blind_copy_recipients, @from_address,
             @reply_to NVARCHAR(MAX) as SendDbMail received them
Returns:     at most one row: ReturnCode INT, Message NVARCHAR(2048): 50644 a list
             or address over its size; 50642 an invalid address, or more than one
             in @from_address or @reply_to; 50643 over 100 recipients in all.
Example:     SELECT p.ReturnCode FROM mailq.DbMailAddressProblem(N'b@', NULL, NULL, NULL, NULL) AS p;
*/
CREATE OR ALTER FUNCTION mailq.DbMailAddressProblem(
    @recipients NVARCHAR(MAX),
    @copy_recipients NVARCHAR(MAX),
    @blind_copy_recipients NVARCHAR(MAX),
    @from_address NVARCHAR(MAX),
    @reply_to NVARCHAR(MAX)
)
RETURNS TABLE
AS
RETURN
SELECT TOP (1)
    x.ReturnCode,
    x.Message
FROM (
    SELECT
        50644 AS ReturnCode,
        CONCAT(v.ParamName, N' is ', LEN(v.Value), N' characters long; the limit here is ', v.MaxLength, N'.')
        AS Message,
        v.Position
    FROM (
        VALUES
        (1, N'@recipients', @recipients, 4000), (2, N'@copy_recipients', @copy_recipients, 4000),
        (3, N'@blind_copy_recipients', @blind_copy_recipients, 4000),
        (4, N'@from_address', @from_address, 520), (5, N'@reply_to', @reply_to, 320)
    ) AS v(Position, ParamName, Value, MaxLength)
    WHERE LEN(v.Value) > v.MaxLength
    UNION ALL
    SELECT
        50642,
        CONCAT(v.ParamName, N': address ''', LEFT(a.Address, 100), N''' ', a.Problem, N'.'),
        10 + v.Position
    FROM (
        VALUES
        (1, N'@recipients', @recipients), (2, N'@copy_recipients', @copy_recipients),
        (3, N'@blind_copy_recipients', @blind_copy_recipients), (4, N'@from_address', @from_address),
        (5, N'@reply_to', @reply_to)
    ) AS v(Position, ParamName, Value)
    CROSS APPLY mailq.ParseAddressList(v.Value) AS a
    WHERE a.Problem IS NOT NULL
    UNION ALL
    SELECT 50642, CONCAT(v.ParamName, N' takes one address.'), 20 + v.Position
    FROM (VALUES (1, N'@from_address', @from_address), (2, N'@reply_to', @reply_to)) AS v(Position, ParamName, Value)
    WHERE (SELECT COUNT(*) FROM mailq.ParseAddressList(v.Value)) > 1
    UNION ALL
    SELECT
        50643,
        CONCAT(
            N'@recipients, @copy_recipients and @blind_copy_recipients name ', c.Recipients,
            N' recipients; the limit here is 100 per mail.'
        ),
        30
    FROM (
        SELECT COUNT(*) AS Recipients
        FROM (VALUES (@recipients), (@copy_recipients), (@blind_copy_recipients)) AS v(Value)
        CROSS APPLY mailq.ParseAddressList(v.Value)
    ) AS c
    WHERE c.Recipients > 100
) AS x
ORDER BY x.Position;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.CheckDbMailRequest (internal: mailq.SendDbMail's checks, before it writes;
granted to nobody, reached through ownership chaining): the profile the caller may
use, msdb's checks in msdb's order with its numbers and return codes, this
package's refusals, and the profile's account (failover: the first not blocked).
Parameters:  SendDbMail's, same names and types (@query already NULLIF'd);
             normalized in place (OUTPUT): @subject (default 'SQL Server Message'),
             @body_format, @importance, @sensitivity (upper case),
             @query_attachment_filename (trimmed, '' -> NULL);
             OUTPUT @ProfileID INT, @AccountName NVARCHAR(128).
Returns:     0 when SendDbMail may enqueue, else SendDbMail's return code after
             a RAISERROR severity 16 (its header lists them).
Result set:  none.  Errors: RAISERROR only, as SendDbMail documents.
Transaction: none of its own; writes nothing.  XACT_ABORT as the caller has it
             (not set here), so a refusal leaves a caller's transaction going.
Isolation:   the caller's (SendDbMail sets none).
Lock order:  reads only: the DbMail profile tables, mailq.SendingAccount.
Example:     EXEC @rc = mailq.CheckDbMailRequest @profile_name = @profile_name, ...;
*/
CREATE OR ALTER PROCEDURE mailq.CheckDbMailRequest
    @profile_name SYSNAME,
    @recipients VARCHAR(MAX),
    @copy_recipients VARCHAR(MAX),
    @blind_copy_recipients VARCHAR(MAX),
    @subject NVARCHAR(255) OUTPUT,
    @body NVARCHAR(MAX),
    @body_format VARCHAR(20) OUTPUT,
    @importance VARCHAR(6) OUTPUT,
    @sensitivity VARCHAR(12) OUTPUT,
    @file_attachments NVARCHAR(MAX),
    @query NVARCHAR(MAX),
    @execute_query_database SYSNAME,
    @attach_query_result_as_file BIT,
    @query_attachment_filename NVARCHAR(260) OUTPUT,
    @query_result_header BIT,
    @query_result_width INT,
    @query_result_separator CHAR(1),
    @exclude_query_output BIT,
    @append_query_error BIT,
    @query_no_truncate BIT,
    @query_result_no_padding BIT,
    @from_address VARCHAR(MAX),
    @reply_to VARCHAR(MAX),
    @mailq_query_result_format VARCHAR(4),
    @ProfileID INT OUTPUT,
    @AccountName NVARCHAR(128) OUTPUT
AS
BEGIN
    -- No SET XACT_ABORT: the checks RAISERROR and RETURN under the caller's setting.
    SET NOCOUNT ON;
    DECLARE @Msg NVARCHAR(2048), @rc INT, @FromList NVARCHAR(400);
    SELECT @ProfileID = NULL, @AccountName = NULL;
    -- 1. Profile: the named one if the caller may use it, else the user's default,
    --    a role's, the public one.  No EXECUTE AS: USER_NAME() is the caller.
    IF @profile_name IS NOT NULL
    BEGIN
        SELECT @ProfileID = p.ProfileID FROM mailq.DbMailProfile AS p WHERE p.ProfileName = @profile_name;
        IF @ProfileID IS NULL
            OR (
                COALESCE(IS_MEMBER(N'db_owner'), 0) = 0
                AND NOT EXISTS (
                    SELECT 1
                    FROM mailq.DbMailPrincipalProfile AS pp
                    WHERE
                        pp.ProfileID = @ProfileID
                        AND (pp.PrincipalName IN (N'public', USER_NAME()) OR IS_MEMBER(pp.PrincipalName) = 1)
                )
            )
        BEGIN
            RAISERROR (14607, 16, 1, 'profile');
            RETURN 1;
        END;
    END;
    ELSE
    BEGIN
        SELECT TOP (1) @ProfileID = pp.ProfileID
        FROM mailq.DbMailPrincipalProfile AS pp
        WHERE pp.IsDefault = 1 AND (pp.PrincipalName IN (N'public', USER_NAME()) OR IS_MEMBER(pp.PrincipalName) = 1)
        ORDER BY CASE pp.PrincipalName WHEN USER_NAME() THEN 0 WHEN N'public' THEN 2 ELSE 1 END, pp.PrincipalName;
        IF @ProfileID IS NULL
        BEGIN
            RAISERROR (14636, 16, 1);
            RETURN 1;
        END;
    END;
    -- 2. msdb's checks, in msdb's order and with its numbers and return codes.
    SET @rc = CASE
        WHEN @attach_query_result_as_file IS NULL THEN 2
        WHEN @exclude_query_output IS NULL THEN 3
        WHEN @query_result_header IS NULL THEN 4
        WHEN @query_result_separator IS NULL OR DATALENGTH(@query_result_separator) = 0 THEN 5
        WHEN @append_query_error IS NULL THEN 6
    END;
    IF @rc IS NOT NULL
    BEGIN
        SET @Msg = CHOOSE(@rc - 1, N'attach_query_result_as_file', N'exclude_query_output',
            N'query_result_header', N'query_result_separator', N'append_query_error');
        RAISERROR (14618, 16, 1, @Msg);
        RETURN @rc;
    END;
    SET @body_format = UPPER(COALESCE(@body_format, 'TEXT'));
    IF @body_format NOT IN ('TEXT', 'HTML')
    BEGIN
        RAISERROR (14626, 16, 1, @body_format);
        RETURN 13;
    END;
    IF @importance IS NULL
    BEGIN
        RAISERROR (14618, 16, 1, N'importance');
        RETURN 15;
    END;
    SET @importance = UPPER(@importance);
    IF @importance NOT IN ('LOW', 'NORMAL', 'HIGH')
    BEGIN
        RAISERROR (14622, 16, 1, @importance);
        RETURN 16;
    END;
    IF @sensitivity IS NULL
    BEGIN
        RAISERROR (14618, 16, 1, N'sensitivity');
        RETURN 17;
    END;
    SET @sensitivity = UPPER(@sensitivity);
    IF @sensitivity NOT IN ('NORMAL', 'PERSONAL', 'PRIVATE', 'CONFIDENTIAL')
    BEGIN
        RAISERROR (14623, 16, 1, @sensitivity);
        RETURN 18;
    END;
    IF COALESCE(LEN(@body), 0) = 0 AND @query IS NULL AND COALESCE(LEN(@file_attachments), 0) = 0
        AND COALESCE(LEN(@subject), 0) = 0
    BEGIN
        RAISERROR (14624, 16, 1, N'@body, @query, @file_attachments, @subject');
        RETURN 19;
    END;
    IF COALESCE(LEN(@subject), 0) = 0 SET @subject = N'SQL Server Message';
    IF COALESCE(LEN(@recipients), 0) = 0 AND COALESCE(LEN(@copy_recipients), 0) = 0
        AND COALESCE(LEN(@blind_copy_recipients), 0) = 0
    BEGIN
        RAISERROR (14624, 16, 1, N'@recipients, @copy_recipients, @blind_copy_recipients');
        RETURN 20;
    END;
    -- msdb refuses a comma outside double quotes; quoted lists go to the address rules.
    SELECT TOP (1) @Msg = v.ParamName, @FromList = LEFT(v.Value, 400)
    FROM (
        VALUES (1, N'@recipients', @recipients), (2, N'@copy_recipients', @copy_recipients),
        (3, N'@blind_copy_recipients', @blind_copy_recipients), (4, N'@reply_to', @reply_to)
    ) AS v(Position, ParamName, Value)
    WHERE v.Value LIKE '%,%' AND CHARINDEX('"', v.Value) = 0
    ORDER BY v.Position;
    IF @FromList IS NOT NULL
    BEGIN
        RAISERROR (14613, 16, 1, @Msg, @FromList);
        RETURN 1;
    END;
    IF @query IS NULL AND @attach_query_result_as_file = 1
    BEGIN
        RAISERROR (14625, 16, 1);
        RETURN 21;
    END;
    SET @query_attachment_filename = NULLIF(LTRIM(RTRIM(@query_attachment_filename)), N'');
    IF @query IS NOT NULL AND @attach_query_result_as_file = 1
        AND (
            @query_attachment_filename LIKE N'%.exe' OR @query_attachment_filename LIKE N'%.dll'
            OR @query_attachment_filename LIKE N'%.vbs' OR @query_attachment_filename LIKE N'%.js'
        )
    BEGIN
        RAISERROR (14630, 16, 1, @query_attachment_filename, N'exe,dll,vbs,js');
        RETURN 2;
    END;
    IF @query IS NOT NULL AND @execute_query_database IS NOT NULL AND DB_ID(@execute_query_database) IS NULL
    BEGIN
        RAISERROR (14633, 16, 1, @execute_query_database);
        RETURN 1;
    END;
    -- 3. This package's refusals: RAISERROR (50000) and RETURN 50641-50652.
    SELECT TOP (1) @rc = r.ReturnCode, @Msg = r.Message
    FROM (
        SELECT 50641 AS ReturnCode, 1 AS Position,
            N'@file_attachments is not supported: the sender worker never reads the database server''s disk; '
            + N'send the content with mailq.EnqueueMail @Attachments, or a query''s result with @query.' AS Message
        WHERE COALESCE(LEN(@file_attachments), 0) > 0
        UNION ALL
        SELECT p.ReturnCode, 2, p.Message
        FROM mailq.DbMailAddressProblem(
            @recipients, @copy_recipients, @blind_copy_recipients, @from_address, @reply_to
        ) AS p
        UNION ALL
        SELECT 50645, 3, N'@body is limited to 2,000,000 characters here.' WHERE LEN(@body) > 2000000
        UNION ALL
        SELECT 50646, 4, N'@subject contains CR or LF; a subject is one line.'
        WHERE @subject LIKE N'%' + NCHAR(13) + N'%' OR @subject LIKE N'%' + NCHAR(10) + N'%'
        UNION ALL
        SELECT 50647, 5, CONCAT(N'@execute_query_database ''', @execute_query_database,
            N''': the query runs as your database user in this database (', DB_NAME(),
            N') only; use three-part names only where that user may (docs/database-mail.md).')
        WHERE @query IS NOT NULL AND DB_ID(@execute_query_database) <> DB_ID()
        UNION ALL
        SELECT 50648, 6, CONCAT(N'@query_result_width must be 10-32767; got ', @query_result_width, N'.')
        WHERE @query IS NOT NULL AND COALESCE(@query_result_width, 0) NOT BETWEEN 10 AND 32767
        UNION ALL
        SELECT 50649, 7, N'@query_result_no_padding and @query_no_truncate are mutually exclusive.'
        WHERE @query IS NOT NULL AND @query_result_no_padding = 1 AND @query_no_truncate = 1
        UNION ALL
        SELECT 50650, 8, CONCAT(N'@mailq_query_result_format must be TEXT, HTML or CSV; got ''',
            @mailq_query_result_format, N'''.')
        WHERE UPPER(COALESCE(@mailq_query_result_format, 'TEXT')) NOT IN ('TEXT', 'HTML', 'CSV')
        UNION ALL
        SELECT 50652, 9, N'@query_attachment_filename must be a file name of at most 255 characters, without / \ :'
        WHERE @query IS NOT NULL AND @attach_query_result_as_file = 1
            AND (LEN(@query_attachment_filename) > 255 OR @query_attachment_filename LIKE N'%[/\:]%')
    ) AS r
    ORDER BY r.Position;
    IF @rc IS NOT NULL
    BEGIN
        RAISERROR (N'%s', 16, 1, @Msg);
        RETURN @rc;
    END;
    -- Failover: the profile's first account not blocked (else the first).
    SELECT TOP (1) @AccountName = a.AccountName
    FROM mailq.DbMailProfileAccount AS pa
    INNER JOIN mailq.DbMailAccount AS da ON pa.AccountID = da.AccountID
    INNER JOIN mailq.SendingAccount AS a ON da.AccountName = a.AccountName
    WHERE pa.ProfileID = @ProfileID
    ORDER BY IIF(a.BlockedUntilUtc > SYSUTCDATETIME(), 1, 0), pa.SequenceNumber, pa.AccountID;
    IF @AccountName IS NULL
    BEGIN
        RAISERROR (N'The profile has no account (mailq.UpsertDbMailProfileAccount).', 16, 1);
        RETURN 50651;
    END;
    RETURN 0;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.SendDbMail: msdb.dbo.sp_send_dbmail on this queue (docs/database-mail.md):
msdb's parameters in its declaration order, then the @mailq_ extensions.  Reference:
https://learn.microsoft.com/en-us/sql/relational-databases/system-stored-procedures/sp-send-dbmail-transact-sql
Parameters:  as sp_send_dbmail's; @file_attachments is refused; @query runs later
             as the caller's database user, in this database (mailq-db dbmail-runner)
             @mailq_query_result_format 'TEXT' (default) | 'HTML' | 'CSV'
             @mailq_mail_id BIGINT OUTPUT; @mailitem_id INT OUTPUT (sysmail_* key)
Result:      no result set; PRINT 'Mail (Id: n) queued.' unless @exclude_query_output = 1
Errors:      as msdb: RAISERROR severity 16 and RETURN n, nothing written, the caller's
             transaction goes on: 14636/14607 rc 1, 14618 rc 2-6, 15, 17, 14626 rc 13,
             14622 rc 16, 14623 rc 18, 14624 rc 19-20, 14613 rc 1, 14625 rc 21,
             14630 rc 2, 14633 rc 1; this package's: RAISERROR 50000 and RETURN
             50641-50652 (docs/errors.md).  THROWn under XACT_ABORT: EnqueueMail's
             errors not checked here (50500, 50160/50161/50168, 50114, 50600, deadlock).
Transaction: validation first (mailq.CheckDbMailRequest, XACT_ABORT as the caller has
             it); then the enqueue and its DbMailItem row in one transaction, its own
             or the caller's.
Isolation:   the caller's (EnqueueMail sets its own).
Lock order:  (via EnqueueMail) mailq.Suppression, mailq.MailQueue,
             mailq.MailAttachment, then mailq.DbMailItem.
Example:     DECLARE @rc INT;
             EXEC @rc = mailq.SendDbMail @recipients = 'dba@example.com', @subject = N'Backups';
*/
CREATE OR ALTER PROCEDURE mailq.SendDbMail
    @profile_name SYSNAME = NULL,
    @recipients VARCHAR(MAX) = NULL,
    @copy_recipients VARCHAR(MAX) = NULL,
    @blind_copy_recipients VARCHAR(MAX) = NULL,
    @subject NVARCHAR(255) = NULL,
    @body NVARCHAR(MAX) = NULL,
    @body_format VARCHAR(20) = NULL,
    @importance VARCHAR(6) = 'NORMAL',
    @sensitivity VARCHAR(12) = 'NORMAL',
    @file_attachments NVARCHAR(MAX) = NULL,
    @query NVARCHAR(MAX) = NULL,
    @execute_query_database SYSNAME = NULL,
    @attach_query_result_as_file BIT = 0,
    @query_attachment_filename NVARCHAR(260) = NULL,
    @query_result_header BIT = 1,
    @query_result_width INT = 256,
    @query_result_separator CHAR(1) = ' ',
    @exclude_query_output BIT = 0,
    @append_query_error BIT = 0,
    @query_no_truncate BIT = 0,
    @query_result_no_padding BIT = 0,
    @mailitem_id INT = NULL OUTPUT,
    @from_address VARCHAR(MAX) = NULL,
    @reply_to VARCHAR(MAX) = NULL,
    @mailq_query_result_format VARCHAR(4) = 'TEXT',
    @mailq_mail_id BIGINT = NULL OUTPUT
AS
BEGIN
    -- XACT_ABORT as the caller has it until the enqueue: checks RAISERROR and RETURN.
    SET NOCOUNT ON;
    DECLARE @Msg NVARCHAR(2048), @rc INT, @ProfileID INT;
    DECLARE @Hold DATETIME2(3) = '9000-01-01T00:00:00';
    SET @mailitem_id = NULL;
    SET @mailq_mail_id = NULL;
    SET @query = NULLIF(@query, N'');
    -- 1.-3. The checks: a refusal has RAISEd its error and returns its code, nothing written.
    DECLARE @AccountName NVARCHAR(128);
    EXEC @rc = mailq.CheckDbMailRequest
        @profile_name = @profile_name,
        @recipients = @recipients,
        @copy_recipients = @copy_recipients,
        @blind_copy_recipients = @blind_copy_recipients,
        @subject = @subject OUTPUT,
        @body = @body,
        @body_format = @body_format OUTPUT,
        @importance = @importance OUTPUT,
        @sensitivity = @sensitivity OUTPUT,
        @file_attachments = @file_attachments,
        @query = @query,
        @execute_query_database = @execute_query_database,
        @attach_query_result_as_file = @attach_query_result_as_file,
        @query_attachment_filename = @query_attachment_filename OUTPUT,
        @query_result_header = @query_result_header,
        @query_result_width = @query_result_width,
        @query_result_separator = @query_result_separator,
        @exclude_query_output = @exclude_query_output,
        @append_query_error = @append_query_error,
        @query_no_truncate = @query_no_truncate,
        @query_result_no_padding = @query_result_no_padding,
        @from_address = @from_address,
        @reply_to = @reply_to,
        @mailq_query_result_format = @mailq_query_result_format,
        @ProfileID = @ProfileID OUTPUT,
        @AccountName = @AccountName OUTPUT;
    -- NULL: the checks did not finish (an error ended them); refuse as well.
    IF @rc IS NULL OR @rc <> 0 RETURN COALESCE(@rc, 1);
    -- 4. The mail; importance and sensitivity become the headers System.Net.Mail writes.
    DECLARE @FromAddress NVARCHAR(MAX) = @from_address, @FromName NVARCHAR(MAX);
    SELECT @FromAddress = a.Address, @FromName = a.DisplayName
    FROM mailq.ParseAddressList(@from_address) AS a;
    DECLARE @Headers NVARCHAR(MAX) = (
        SELECT N'{' + STRING_AGG(CONCAT(N'"', h.HeaderName, N'": "', h.HeaderValue, N'"'), N', ') + N'}'
        FROM (
            VALUES
            ('HIGH', NULL, N'X-Priority', N'1'), ('HIGH', NULL, N'Priority', N'urgent'),
            ('HIGH', NULL, N'Importance', N'high'), ('LOW', NULL, N'X-Priority', N'5'),
            ('LOW', NULL, N'Priority', N'non-urgent'), ('LOW', NULL, N'Importance', N'low'),
            (NULL, 'PERSONAL', N'Sensitivity', N'Personal'), (NULL, 'PRIVATE', N'Sensitivity', N'Private'),
            (NULL, 'CONFIDENTIAL', N'Sensitivity', N'Company-Confidential')
        ) AS h(Importance, Sensitivity, HeaderName, HeaderValue)
        WHERE h.Importance = @importance OR h.Sensitivity = @sensitivity
    );
    -- Mail with a query waits until mailq.CompleteDbMailQuery makes it due.
    DECLARE @Due DATETIME2(3) = IIF(@query IS NULL, NULL, @Hold);
    DECLARE @ToAddress NVARCHAR(MAX) = NULLIF(LTRIM(RTRIM(@recipients)), '');
    DECLARE @MailBody NVARCHAR(MAX) = COALESCE(@body, N'');
    DECLARE @EnqueueFormat NVARCHAR(20) = IIF(@body_format = 'HTML', N'Html', N'Text');
    DECLARE @MailID BIGINT, @ItemID INT;
    SET XACT_ABORT ON;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        EXEC mailq.EnqueueMail
            @ToAddress = @ToAddress,
            @CC = @copy_recipients,
            @BCC = @blind_copy_recipients,
            @Subject = @subject,
            @Body = @MailBody,
            @BodyFormat = @EnqueueFormat,
            @FromAddress = @FromAddress,
            @FromName = @FromName,
            @ReplyTo = @reply_to,
            @Headers = @Headers,
            @AccountName = @AccountName,
            @DateToProcess = @Due,
            @MailID = @MailID OUTPUT;
        INSERT INTO mailq.DbMailItem (
            MailID, ProfileID, Importance, Sensitivity, Query, ExecuteQueryDatabase,
            AttachQueryResultAsFile, QueryAttachmentFilename, QueryResultHeader, QueryResultWidth,
            QueryResultSeparator, ExcludeQueryOutput, AppendQueryError, QueryNoTruncate, QueryResultNoPadding,
            QueryResultFormat, SendRequestUser, SendRequestDate, RequestUser, RequestUserSid,
            QueryState, QueryDueAtUtc
        )
        VALUES (
            @MailID, @ProfileID, @importance, @sensitivity, @query, IIF(@query IS NULL, NULL, DB_NAME()),
            @attach_query_result_as_file, @query_attachment_filename, @query_result_header,
            COALESCE(@query_result_width, 256), @query_result_separator, @exclude_query_output,
            @append_query_error, COALESCE(@query_no_truncate, 0), COALESCE(@query_result_no_padding, 0),
            UPPER(COALESCE(@mailq_query_result_format, 'TEXT')),
            COALESCE(SUSER_SNAME(), USER_NAME()), CAST(SYSDATETIME() AS DATETIME), USER_NAME(), USER_SID(),
            IIF(@query IS NULL, NULL, N'Pending'), IIF(@query IS NULL, NULL, SYSUTCDATETIME())
        );
        SET @ItemID = SCOPE_IDENTITY();
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SET @mailitem_id = @ItemID;
    SET @mailq_mail_id = @MailID;
    IF @exclude_query_output = 0
    BEGIN
        SET @Msg = COALESCE(FORMATMESSAGE(14635, @ItemID), CONCAT(N'Mail (Id: ', @ItemID, N') queued.'));
        PRINT @Msg;
    END;
    RETURN 0;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.UpsertDbMailProfile: creates a Database Mail compatible profile (for
mailq.SendDbMail) or changes its description (msdb's sysmail_add/update_profile_sp).
Parameters:  @ProfileName NVARCHAR(128), required; @Description NVARCHAR(256).
Outputs:     @ProfileID INT: the profile_id the sysmail_* views show.
Errors:      50198 @ProfileName missing or a value over its size.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK reads the latest committed row).
Lock order:  DbMailProfile, DbMailAccount, DbMailProfileAccount, DbMailPrincipalProfile.
Example:     EXEC mailq.UpsertDbMailProfile @ProfileName = N'Ops', @Description = N'Alerts';
*/
CREATE OR ALTER PROCEDURE mailq.UpsertDbMailProfile
    @ProfileName NVARCHAR(4000),
    @Description NVARCHAR(4000) = NULL,
    @ProfileID INT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL
        THROW 50198, N'@ProfileName is required.', 1;
    IF LEN(@ProfileName) > 128 OR LEN(@Description) > 256
        THROW 50198, N'@ProfileName (128) or @Description (256) is over its size.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        SET @ProfileID = NULL;
        -- UPDLOCK, HOLDLOCK: insert-if-absent without a race (a rarely written table).
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK, HOLDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NOT NULL
            UPDATE p
            SET p.Description = @Description
            FROM mailq.DbMailProfile AS p
            WHERE p.ProfileID = @ProfileID;
        ELSE
        BEGIN
            INSERT INTO mailq.DbMailProfile (ProfileName, Description)
            VALUES (@ProfileName, @Description);
            SET @ProfileID = SCOPE_IDENTITY();
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.DeleteDbMailProfile: deletes a profile with its account list and grants (msdb's
sysmail_delete_profile_sp); mail already queued through it keeps its account.
Parameters:  @ProfileName NVARCHAR(128), required.  Errors: 50198 @ProfileName missing; 50250 no such profile.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.DbMailProfile, mailq.DbMailProfileAccount, mailq.DbMailPrincipalProfile.
Example:     EXEC mailq.DeleteDbMailProfile @ProfileName = N'Ops';
*/
CREATE OR ALTER PROCEDURE mailq.DeleteDbMailProfile
    @ProfileName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL
        THROW 50198, N'@ProfileName is required.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        DECLARE @ProfileID INT;
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@ProfileName ''', @ProfileName, N''' is not a profile.');
            THROW 50250, @Msg, 1;
        END;
        DELETE pa
        FROM mailq.DbMailProfileAccount AS pa
        WHERE pa.ProfileID = @ProfileID;
        DELETE pp
        FROM mailq.DbMailPrincipalProfile AS pp
        WHERE pp.ProfileID = @ProfileID;
        DELETE p
        FROM mailq.DbMailProfile AS p
        WHERE p.ProfileID = @ProfileID;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.UpsertDbMailProfileAccount: adds a sending account to a profile or changes
its failover place (msdb's sysmail_add/update_profileaccount_sp); SendDbMail takes
the lowest @SequenceNumber not blocked.
Parameters:  @ProfileName NVARCHAR(128); @AccountName NVARCHAR(128) (a
             mailq.SendingAccount); @SequenceNumber INT >= 0; all required
Errors:      50198 a parameter missing or @SequenceNumber negative;
             50250 no such profile; 50253 no such sending account.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK reads the latest committed row).
Lock order:  mailq.DbMailProfile, mailq.DbMailAccount, mailq.DbMailProfileAccount.
Example:     EXEC mailq.UpsertDbMailProfileAccount @ProfileName = N'Ops',
                 @AccountName = N'smtp-primary', @SequenceNumber = 1;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertDbMailProfileAccount
    @ProfileName NVARCHAR(4000),
    @AccountName NVARCHAR(4000),
    @SequenceNumber INT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL OR NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50198, N'@ProfileName and @AccountName are required.', 1;
    IF @SequenceNumber IS NULL OR @SequenceNumber < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@SequenceNumber must be 0 or more; got ', COALESCE(CONVERT(NVARCHAR(20), @SequenceNumber), N'NULL'), N'.'
        );
        THROW 50198, @Msg, 1;
    END;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        DECLARE @ProfileID INT, @AccountID INT;
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@ProfileName ''', @ProfileName, N''' is not a profile (mailq.UpsertDbMailProfile).');
            THROW 50250, @Msg, 1;
        END;
        IF NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @AccountName)
        BEGIN
            SET @Msg = CONCAT(
                N'@AccountName ''', @AccountName, N''' is not a sending account (mailq.UpsertSendingAccount).'
            );
            THROW 50253, @Msg, 1;
        END;
        -- UPDLOCK, HOLDLOCK: insert-if-absent on small, rarely written tables.
        SELECT @AccountID = da.AccountID
        FROM mailq.DbMailAccount AS da WITH (UPDLOCK, HOLDLOCK)
        WHERE da.AccountName = @AccountName;
        IF @AccountID IS NULL
        BEGIN
            INSERT INTO mailq.DbMailAccount (AccountName) VALUES (@AccountName);
            SET @AccountID = SCOPE_IDENTITY();
        END;
        IF EXISTS (
            SELECT 1
            FROM mailq.DbMailProfileAccount AS pa WITH (UPDLOCK, HOLDLOCK)
            WHERE pa.ProfileID = @ProfileID AND pa.AccountID = @AccountID
        )
            UPDATE pa
            SET pa.SequenceNumber = @SequenceNumber
            FROM mailq.DbMailProfileAccount AS pa
            WHERE pa.ProfileID = @ProfileID AND pa.AccountID = @AccountID;
        ELSE
            INSERT INTO mailq.DbMailProfileAccount (ProfileID, AccountID, SequenceNumber)
            VALUES (@ProfileID, @AccountID, @SequenceNumber);
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.DeleteDbMailProfileAccount: removes a sending account from a profile (msdb's
sysmail_delete_profileaccount_sp); mail already queued keeps its account.
Parameters:  @ProfileName NVARCHAR(128), @AccountName NVARCHAR(128), required.
Errors:      50198 a parameter missing; 50250 no such profile; 50253 not in the profile.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.DbMailProfile, mailq.DbMailAccount, mailq.DbMailProfileAccount.
Example:     EXEC mailq.DeleteDbMailProfileAccount @ProfileName = N'Ops', @AccountName = N'smtp-old';
*/
CREATE OR ALTER PROCEDURE mailq.DeleteDbMailProfileAccount
    @ProfileName NVARCHAR(4000),
    @AccountName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL OR NULLIF(LTRIM(RTRIM(@AccountName)), N'') IS NULL
        THROW 50198, N'@ProfileName and @AccountName are required.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        DECLARE @ProfileID INT;
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@ProfileName ''', @ProfileName, N''' is not a profile.');
            THROW 50250, @Msg, 1;
        END;
        DELETE pa
        FROM mailq.DbMailProfileAccount AS pa
        INNER JOIN mailq.DbMailAccount AS da ON pa.AccountID = da.AccountID
        WHERE pa.ProfileID = @ProfileID AND da.AccountName = @AccountName;
        IF @@ROWCOUNT = 0
        BEGIN
            SET @Msg = CONCAT(
                N'@AccountName ''', @AccountName, N''' is not an account of profile ''', @ProfileName, N'''.'
            );
            THROW 50253, @Msg, 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.UpsertDbMailPrincipalProfile: lets a principal use a profile, optionally as
its default (msdb's sysmail_add/update_principalprofile_sp); N'public' makes a
public profile.  A new default clears the principal's previous one.
Parameters:  @ProfileName NVARCHAR(128), required
             @PrincipalName NVARCHAR(128): a user or role of this database, or N'public'
             @IsDefault BIT = 0
Errors:      50198 a parameter missing; 50250 no such profile;
             50254 @PrincipalName is not a user or role of this database.
Transaction: its own or the caller's; an error is re-raised and dooms the caller's.
Isolation:   READ COMMITTED, set here (UPDLOCK reads the latest committed row).
Lock order:  mailq.DbMailProfile, mailq.DbMailPrincipalProfile.
Example:     EXEC mailq.UpsertDbMailPrincipalProfile @ProfileName = N'Ops',
                 @PrincipalName = N'public', @IsDefault = 1;
*/
CREATE OR ALTER PROCEDURE mailq.UpsertDbMailPrincipalProfile
    @ProfileName NVARCHAR(4000),
    @PrincipalName NVARCHAR(4000),
    @IsDefault BIT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @IsDefault = COALESCE(@IsDefault, 0);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL OR NULLIF(LTRIM(RTRIM(@PrincipalName)), N'') IS NULL
        THROW 50198, N'@ProfileName and @PrincipalName are required.', 1;
    IF @PrincipalName <> N'public' AND DATABASE_PRINCIPAL_ID(@PrincipalName) IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'@PrincipalName ''', LEFT(@PrincipalName, 128), N''' is not a user or role of this database.'
        );
        THROW 50254, @Msg, 1;
    END;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        DECLARE @ProfileID INT;
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@ProfileName ''', @ProfileName, N''' is not a profile (mailq.UpsertDbMailProfile).');
            THROW 50250, @Msg, 1;
        END;
        -- UPDLOCK, HOLDLOCK: two calls cannot both leave a default.
        IF @IsDefault = 1
            UPDATE pp
            SET pp.IsDefault = 0
            FROM mailq.DbMailPrincipalProfile AS pp WITH (UPDLOCK, HOLDLOCK)
            WHERE pp.PrincipalName = @PrincipalName AND pp.IsDefault = 1 AND pp.ProfileID <> @ProfileID;
        IF EXISTS (
            SELECT 1
            FROM mailq.DbMailPrincipalProfile AS pp WITH (UPDLOCK, HOLDLOCK)
            WHERE pp.PrincipalName = @PrincipalName AND pp.ProfileID = @ProfileID
        )
            UPDATE pp
            SET pp.IsDefault = @IsDefault
            FROM mailq.DbMailPrincipalProfile AS pp
            WHERE pp.PrincipalName = @PrincipalName AND pp.ProfileID = @ProfileID;
        ELSE
            INSERT INTO mailq.DbMailPrincipalProfile (PrincipalName, ProfileID, IsDefault)
            VALUES (@PrincipalName, @ProfileID, @IsDefault);
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.DeleteDbMailPrincipalProfile: withdraws a principal's right to use a profile, and the
default with it (msdb's sysmail_delete_principalprofile_sp).
Parameters:  @ProfileName NVARCHAR(128), @PrincipalName NVARCHAR(128), required.
Errors:      50198 a parameter missing; 50250 no such profile; 50254 no grant to withdraw.
Transaction: its own if none is open, else the caller's; an error dooms it (XACT_ABORT ON).
Isolation:   sets READ COMMITTED.  Lock order: mailq.DbMailProfile, mailq.DbMailPrincipalProfile.
Example:     EXEC mailq.DeleteDbMailPrincipalProfile @ProfileName = N'Ops', @PrincipalName = N'public';
*/
CREATE OR ALTER PROCEDURE mailq.DeleteDbMailPrincipalProfile
    @ProfileName NVARCHAR(4000),
    @PrincipalName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@ProfileName)), N'') IS NULL OR NULLIF(LTRIM(RTRIM(@PrincipalName)), N'') IS NULL
        THROW 50198, N'@ProfileName and @PrincipalName are required.', 1;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        DECLARE @ProfileID INT;
        SELECT @ProfileID = p.ProfileID
        FROM mailq.DbMailProfile AS p WITH (UPDLOCK)
        WHERE p.ProfileName = @ProfileName;
        IF @ProfileID IS NULL
        BEGIN
            SET @Msg = CONCAT(N'@ProfileName ''', @ProfileName, N''' is not a profile.');
            THROW 50250, @Msg, 1;
        END;
        DELETE pp
        FROM mailq.DbMailPrincipalProfile AS pp
        WHERE pp.ProfileID = @ProfileID AND pp.PrincipalName = @PrincipalName;
        IF @@ROWCOUNT = 0
        BEGIN
            SET @Msg = CONCAT(
                N'@PrincipalName ''', LEFT(@PrincipalName, 128), N''' has no grant on profile ''', @ProfileName, N'''.'
            );
            THROW 50254, @Msg, 1;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Grants of role MailqDbMailUser: mailq.SendDbMail and the sysmail_* views (own mail).
*/
GRANT EXECUTE ON OBJECT::mailq.SendDbMail TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_allitems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_sentitems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_unsentitems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_faileditems TO MailqDbMailUser;
GRANT SELECT ON OBJECT::mailq.sysmail_event_log TO MailqDbMailUser;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Grants of role MailqAdmin for Database Mail: send, manage profiles, read all items.
*/
GRANT EXECUTE ON OBJECT::mailq.SendDbMail TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertDbMailProfile TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.DeleteDbMailProfile TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertDbMailProfileAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.DeleteDbMailProfileAccount TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.UpsertDbMailPrincipalProfile TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.DeleteDbMailPrincipalProfile TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_allitems TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_sentitems TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_unsentitems TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_faileditems TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_event_log TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqBounceReader: the bounce reader (`mailq-db bounces`) and the
one-click unsubscribe endpoint (`mailq-db unsubscribe-server`): record
bounces, complaints and unsubscribes, nothing else.  Not MailqSender: these
processes read mail written by strangers and answer HTTP from the internet,
so they get neither the claim and acknowledgement of mail nor any
administration; a compromised reader can at worst suppress addresses.
*/
IF DATABASE_PRINCIPAL_ID(N'MailqBounceReader') IS NULL
    CREATE ROLE MailqBounceReader AUTHORIZATION dbo;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.SuppressionsAsOf: the suppression list as operators read it, at one moment;
the one place of its rules: AppName NULL means every application of the account
(stored N''), IsActive 0 once ExpiresAtUtc has passed @AsOfUtc.  Inline: it expands
into the caller's statement (the view mailq.Suppressions, mailq.ListSuppressions).
Parameters:  @AsOfUtc DATETIME2(7): the moment IsActive is judged at (7 digits, so
             the view's SYSUTCDATETIME() is compared unrounded).
Returns:     AccountName, AppName, Address, Reason, Source, Detail, MailID,
             CreatedAtUtc, UpdatedAtUtc, ExpiresAtUtc, IsActive BIT; one row per
             mailq.Suppression row, no hints (the caller's isolation applies).
Example:     SELECT s.Address FROM mailq.SuppressionsAsOf(SYSUTCDATETIME()) AS s WHERE s.IsActive = 1;
*/
CREATE OR ALTER FUNCTION mailq.SuppressionsAsOf(@AsOfUtc DATETIME2(7))
RETURNS TABLE
AS
RETURN
SELECT
    s.AccountName,
    NULLIF(s.AppName, N'') AS AppName,
    s.Address,
    s.Reason,
    s.Source,
    s.Detail,
    s.MailID,
    s.CreatedAtUtc,
    s.UpdatedAtUtc,
    s.ExpiresAtUtc,
    CAST(IIF(s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @AsOfUtc, 1, 0) AS BIT) AS IsActive
FROM mailq.Suppression AS s;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.Suppressions: the suppression list as operators read it, now: AppName NULL
means every application of the account; IsActive 0 once ExpiresAtUtc passed
(the rules: mailq.SuppressionsAsOf).
*/
CREATE OR ALTER VIEW mailq.Suppressions
AS
SELECT
    s.AccountName,
    s.AppName,
    s.Address,
    s.Reason,
    s.Source,
    s.Detail,
    s.MailID,
    s.CreatedAtUtc,
    s.UpdatedAtUtc,
    s.ExpiresAtUtc,
    s.IsActive
FROM mailq.SuppressionsAsOf(SYSUTCDATETIME()) AS s;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RecentBounceReports: bounce, complaint and unsubscribe reports of the
last 7 days (a range of IX_BounceReport_ReceivedAtUtc), newest first when
ordered by ReceivedAtUtc DESC; whether each address is suppressed now.
*/
CREATE OR ALTER VIEW mailq.RecentBounceReports
AS
SELECT
    b.ReceivedAtUtc,
    b.AccountName,
    b.AppName,
    b.MailID,
    b.Address,
    b.Kind,
    b.Action,
    b.Status,
    b.SmtpCode,
    b.Detail,
    b.Source,
    CAST(IIF(EXISTS (
        SELECT 1
        FROM mailq.Suppression AS s
        WHERE
            s.AccountName = b.AccountName AND s.Address = b.Address
            AND s.AppName IN (N'', ISNULL(b.AppName, N''))
            AND (s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > SYSUTCDATETIME())
    ), 1, 0) AS BIT) AS Suppressed
FROM mailq.BounceReport AS b
WHERE b.ReceivedAtUtc >= DATEADD(DAY, -7, SYSUTCDATETIME());
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ApplySuppressions (internal: called by AddSuppression, RecordBounce and
RecordUnsubscribe; granted to nobody): adds or renews suppressions, then takes the
addresses out of the accounts' queued mail (IX_MailQueue_ClaimByAccount): UnSent
mail loses them from To/CC/BCC (event RecipientSuppressed), or is Stopped when
nobody is left; Sending mail keeps its lists and gets a Refused outcome per
address, so no later attempt sends to it.  ClaimMail is untouched.
Parameters:  @Suppressions NVARCHAR(MAX), required: JSON array of {"AccountName",
             "Address" (lower-case), "AppName" (null or "": every application),
             "Reason", "Source", "Detail", "MailID", "ExpiresAtUtc"}, validated by
             the callers; @SweptMails INT OUTPUT, @StoppedMails INT OUTPUT.
Result set:  none.  Errors: none of its own; SQL Server's are re-raised.
Transaction: its own if none is open, else the caller's; an error dooms either.
Isolation:   READ COMMITTED; suppression rows WITH (UPDLOCK, HOLDLOCK) so two
             writers of one address serialize; queued mail locked with UPDLOCK
             before it is read for the change.  DEADLOCK_PRIORITY LOW: the sweep,
             never a worker, is the victim.
Lock order:  mailq.Suppression, mailq.SuppressionHistory, mailq.MailQueue (U -> X),
             mailq.MailEvent, mailq.MailRecipientOutcome (docs/bounces.md).  An
             enqueue's shared key-range lock on the address makes the insert here
             wait for that mail to commit, then sweep it.
Example:     EXEC mailq.ApplySuppressions @Suppressions = N'[{"AccountName":"news",
                 "Address":"a@example.com","Reason":"Manual","Source":"dba"}]';
*/
CREATE OR ALTER PROCEDURE mailq.ApplySuppressions
    @Suppressions NVARCHAR(MAX),
    @SweptMails INT = NULL OUTPUT,
    @StoppedMails INT = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SET DEADLOCK_PRIORITY LOW;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    SET @SweptMails = 0;
    SET @StoppedMails = 0;
    DECLARE @S TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        Reason NVARCHAR(16) NOT NULL,
        Source NVARCHAR(200) NOT NULL,
        Detail NVARCHAR(1000) NULL,
        MailID BIGINT NULL,
        ExpiresAtUtc DATETIME2(3) NULL,
        PRIMARY KEY (AccountName, Address, AppName)
    );
    -- JSON_VALUE per field (lax: a missing field is NULL); times as ISO 8601 (style 126)
    INSERT INTO @S (AccountName, Address, AppName, Reason, Source, Detail, MailID, ExpiresAtUtc)
    SELECT x.AccountName, x.Address, x.AppName, x.Reason, x.Source, x.Detail, x.MailID, x.ExpiresAtUtc
    FROM (
        SELECT
            v.AccountName,
            v.Address,
            v.AppName,
            v.Reason,
            v.Source,
            v.Detail,
            v.MailID,
            v.ExpiresAtUtc,
            ROW_NUMBER() OVER (PARTITION BY v.AccountName, v.Address, v.AppName ORDER BY v.Ordinal) AS Nth
        FROM (
            SELECT
                CAST(j.[key] AS INT) AS Ordinal,
                CAST(JSON_VALUE(j.[value], N'$.AccountName') AS NVARCHAR(128)) AS AccountName,
                CAST(LOWER(JSON_VALUE(j.[value], N'$.Address')) AS NVARCHAR(320)) AS Address,
                CAST(ISNULL(JSON_VALUE(j.[value], N'$.AppName'), N'') AS NVARCHAR(128)) AS AppName,
                CAST(JSON_VALUE(j.[value], N'$.Reason') AS NVARCHAR(16)) AS Reason,
                CAST(JSON_VALUE(j.[value], N'$.Source') AS NVARCHAR(200)) AS Source,
                CAST(LEFT(JSON_VALUE(j.[value], N'$.Detail'), 1000) AS NVARCHAR(1000)) AS Detail,
                TRY_CAST(JSON_VALUE(j.[value], N'$.MailID') AS BIGINT) AS MailID,
                TRY_CONVERT(DATETIME2(3), JSON_VALUE(j.[value], N'$.ExpiresAtUtc'), 126) AS ExpiresAtUtc
            FROM OPENJSON(@Suppressions) AS j
        ) AS v
    ) AS x
    WHERE x.Nth = 1;
    DECLARE @Changed TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        Action NVARCHAR(16) NOT NULL,
        Reason NVARCHAR(16) NOT NULL,
        Source NVARCHAR(200) NOT NULL,
        Detail NVARCHAR(1000) NULL,
        MailID BIGINT NULL
    );
    DECLARE @Mail TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Swept TABLE (
        ID BIGINT NOT NULL PRIMARY KEY,
        Status NVARCHAR(16) NOT NULL,
        ToAddress NVARCHAR(MAX) NULL,
        CC NVARCHAR(MAX) NULL,
        BCC NVARCHAR(MAX) NULL,
        Suppressed NVARCHAR(MAX) NULL,
        EntriesLeft INT NOT NULL
    );
    DECLARE @Refuse TABLE (
        MailID BIGINT NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AttemptNo INT NOT NULL,
        PRIMARY KEY (MailID, Address)
    );
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- 1. Renew what exists: the newest reason, source and detail; the
        --    longer of the two lifetimes (NULL = forever wins; an expired row
        --    takes the new expiry).  UPDLOCK, HOLDLOCK: see Isolation.
        UPDATE s
        SET
            s.Reason = i.Reason,
            s.Source = i.Source,
            s.Detail = i.Detail,
            s.MailID = COALESCE(i.MailID, s.MailID),
            s.UpdatedAtUtc = @Now,
            s.ExpiresAtUtc = CASE
                WHEN s.ExpiresAtUtc IS NULL OR i.ExpiresAtUtc IS NULL THEN NULL
                WHEN i.ExpiresAtUtc > s.ExpiresAtUtc THEN i.ExpiresAtUtc
                ELSE s.ExpiresAtUtc
            END
        OUTPUT
            inserted.AccountName, inserted.Address, inserted.AppName, N'Renewed', inserted.Reason,
            inserted.Source, inserted.Detail, inserted.MailID
        INTO @Changed (AccountName, Address, AppName, Action, Reason, Source, Detail, MailID)
        FROM mailq.Suppression AS s WITH (UPDLOCK, HOLDLOCK)
        INNER JOIN @S AS i ON s.AccountName = i.AccountName AND s.Address = i.Address AND s.AppName = i.AppName;
        -- 2. Add what is new (waits for enqueues that read this address's
        --    key range: they commit first and are swept below).
        INSERT INTO mailq.Suppression (
            AccountName, Address, AppName, Reason, Source, Detail, MailID, CreatedAtUtc, UpdatedAtUtc, ExpiresAtUtc
        )
        OUTPUT
            inserted.AccountName, inserted.Address, inserted.AppName, N'Added', inserted.Reason,
            inserted.Source, inserted.Detail, inserted.MailID
        INTO @Changed (AccountName, Address, AppName, Action, Reason, Source, Detail, MailID)
        SELECT i.AccountName, i.Address, i.AppName, i.Reason, i.Source, i.Detail, i.MailID, @Now, @Now, i.ExpiresAtUtc
        FROM @S AS i
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.Suppression AS s WITH (UPDLOCK, HOLDLOCK)
            WHERE s.AccountName = i.AccountName AND s.Address = i.Address AND s.AppName = i.AppName
        );
        INSERT INTO mailq.SuppressionHistory (
            AccountName, Address, AppName, Action, Reason, Source, Detail, MailID, OccurredAtUtc
        )
        SELECT c.AccountName, c.Address, c.AppName, c.Action, c.Reason, c.Source, c.Detail, c.MailID, @Now
        FROM @Changed AS c;
        -- 3. Candidates: queued mail of these accounts whose lists mention an
        --    address (a text probe; the exact test is step 5).  A range of
        --    IX_MailQueue_ClaimByAccount per account, no locks kept.
        INSERT INTO @Mail (ID)
        SELECT DISTINCT q.ID
        FROM mailq.MailQueue AS q
        INNER JOIN @S AS i ON q.AccountName = i.AccountName
        WHERE
            q.Status IN (N'UnSent', N'Sending')
            AND (i.AppName = N'' OR i.AppName = q.AppName)
            AND CHARINDEX(i.Address, LOWER(CONCAT(q.ToAddress, N';', q.CC, N';', q.BCC))) > 0;
        -- 4. Lock them (UPDLOCK reads the committed row even under
        --    READ_COMMITTED_SNAPSHOT) and 5. compute their lists without
        --    every address suppressed for them (mailq.Suppression now holds
        --    this call's rows too).
        INSERT INTO @Swept (ID, Status, ToAddress, CC, BCC, Suppressed, EntriesLeft)
        SELECT q.ID, q.Status, f.ToAddress, f.CC, f.BCC, f.Suppressed, f.EntriesLeft
        FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK, FORCESEEK)
        INNER JOIN @Mail AS m ON q.ID = m.ID
        CROSS APPLY mailq.FilterSuppressedRecipients(q.AccountName, q.AppName, q.ToAddress, q.CC, q.BCC) AS f
        WHERE q.Status IN (N'UnSent', N'Sending') AND f.SuppressedCount > 0;
        -- 6. UnSent with recipients left: the lists without them.
        UPDATE q
        SET
            q.ToAddress = ISNULL(w.ToAddress, N''),
            q.CC = w.CC,
            q.BCC = w.BCC
        OUTPUT
            inserted.ID, inserted.AppName, N'RecipientSuppressed', inserted.Status, inserted.AttemptCount,
            NULL, LEFT(CONCAT(N'not sent to (suppressed): ', w.Suppressed), 4000), @Now
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        INNER JOIN @Swept AS w ON q.ID = w.ID
        WHERE w.Status = N'UnSent' AND w.EntriesLeft > 0;
        SET @SweptMails = @@ROWCOUNT;
        -- 7. UnSent with nobody left: Stopped, as mailq.StopMail leaves it.
        UPDATE q
        SET
            q.Status = N'Stopped',
            q.DateProcessed = @Now,
            q.LastError = LEFT(CONCAT(N'every recipient is suppressed: ', w.Suppressed), 4000)
        OUTPUT
            inserted.ID, inserted.AppName, N'Stopped', inserted.Status, inserted.AttemptCount,
            NULL, inserted.LastError, @Now
        INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        FROM mailq.MailQueue AS q
        INNER JOIN @Swept AS w ON q.ID = w.ID
        WHERE w.Status = N'UnSent' AND w.EntriesLeft = 0;
        SET @StoppedMails = @@ROWCOUNT;
        SET @SweptMails += @StoppedMails;
        -- 8. Sending: a Refused outcome per suppressed address, so a later
        --    attempt skips it (mailq.GetRecipientOutcomes); Delivered stays.
        INSERT INTO mailq.MailEvent (MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc)
        SELECT
            q.ID, q.AppName, N'RecipientSuppressed', q.Status, q.AttemptCount, NULL,
            LEFT(CONCAT(N'not sent to (suppressed) after this attempt: ', w.Suppressed), 4000), @Now
        FROM @Swept AS w
        INNER JOIN mailq.MailQueue AS q ON w.ID = q.ID
        WHERE w.Status = N'Sending';
        SET @SweptMails += @@ROWCOUNT;
        INSERT INTO @Refuse (MailID, Address, AttemptNo)
        SELECT q.ID, CAST(r.Address AS NVARCHAR(320)), q.AttemptCount
        FROM @Swept AS w
        INNER JOIN mailq.MailQueue AS q ON w.ID = q.ID
        CROSS APPLY mailq.MailRecipientList(q.ToAddress, q.CC, q.BCC) AS r
        WHERE
            w.Status = N'Sending' AND r.IsFirst = 1 AND LEN(r.Address) <= 320
            AND EXISTS (
                SELECT 1
                FROM mailq.Suppression AS s
                WHERE
                    s.AccountName = q.AccountName AND s.Address = r.Address
                    AND s.AppName IN (N'', ISNULL(q.AppName, N''))
                    AND (s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @Now)
            );
        UPDATE o
        SET
            o.Outcome = N'Refused',
            o.SmtpCode = NULL,
            o.SmtpText = N'suppressed (mailq.Suppression)',
            o.UpdatedAtUtc = @Now
        FROM mailq.MailRecipientOutcome AS o
        INNER JOIN @Refuse AS f ON o.MailID = f.MailID AND o.Address = f.Address
        WHERE o.Outcome = N'Deferred';
        INSERT INTO mailq.MailRecipientOutcome (MailID, Address, Outcome, SmtpCode, SmtpText, AttemptNo, UpdatedAtUtc)
        SELECT f.MailID, f.Address, N'Refused', NULL, N'suppressed (mailq.Suppression)', f.AttemptNo, @Now
        FROM @Refuse AS f
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.MailRecipientOutcome AS o
            WHERE o.MailID = f.MailID AND o.Address = f.Address
        );
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.CheckBounceReport (internal: mailq.RecordBounce's parameter checks, before its
transaction; granted to nobody, reached through ownership chaining): validates one
report's parameters and resolves the mail its VERP token names.
Parameters:  RecordBounce's @ReportKey, @Recipients, @Source, @AccountName, @MailID,
             @RecipientNo, @HardBounceLimit (already defaulted), @SoftBounceLimit;
             OUTPUT: @KnownMail (NULL: no queued mail), @Account (the mail's, else
             @AccountName), @App, @To, @CC, @BCC (the mail's lists), @TokenAddress
             (the address @RecipientNo names in a known mail, else NULL).
Result set:  none.
Errors:      RecordBounce's 50607, 50604, 50610, 50609, 50601, in that order.
Transaction: none of its own; writes nothing (inside the caller's, if one is open).
Isolation:   READ COMMITTED (as RecordBounce); plain reads of the mail and account.
Lock order:  mailq.MailQueue, mailq.SendingAccount (shared, statement-long).
Example:     EXEC mailq.CheckBounceReport @ReportKey = @ReportKey, ..., @KnownMail = @KnownMail OUTPUT, ...;
*/
CREATE OR ALTER PROCEDURE mailq.CheckBounceReport
    @ReportKey VARBINARY(32),
    @Recipients NVARCHAR(MAX),
    @Source NVARCHAR(200),
    @AccountName NVARCHAR(128),
    @MailID BIGINT,
    @RecipientNo INT,
    @HardBounceLimit INT,
    @SoftBounceLimit INT,
    @KnownMail BIGINT OUTPUT,
    @Account NVARCHAR(128) OUTPUT,
    @App NVARCHAR(128) OUTPUT,
    @To NVARCHAR(4000) OUTPUT,
    @CC NVARCHAR(4000) OUTPUT,
    @BCC NVARCHAR(4000) OUTPUT,
    @TokenAddress NVARCHAR(320) OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SELECT @KnownMail = NULL, @Account = NULL, @App = NULL, @To = NULL, @CC = NULL, @BCC = NULL,
        @TokenAddress = NULL;
    IF @ReportKey IS NULL OR DATALENGTH(@ReportKey) <> 32
        THROW 50607, N'@ReportKey must be 32 bytes: the SHA-256 of the report''s Message-ID (or of its bytes).', 1;
    IF NULLIF(LTRIM(RTRIM(@Source)), N'') IS NULL
        THROW 50604, N'@Source is required (1-200 characters): where the report was read.', 1;
    IF @HardBounceLimit NOT BETWEEN 1 AND 100 OR @SoftBounceLimit NOT BETWEEN 1 AND 100
    BEGIN
        SET @Msg = CONCAT(N'@HardBounceLimit must be 1-100 and @SoftBounceLimit 1-100 or NULL; got ',
            @HardBounceLimit, N' and ', COALESCE(CAST(@SoftBounceLimit AS NVARCHAR(12)), N'NULL'), N'.');
        THROW 50610, @Msg, 1;
    END;
    -- ISJSON, OPENJSON and JSON_VALUE in separate statements (no guaranteed
    -- evaluation order inside one condition).
    DECLARE @RecipientsOk BIT = 1;
    IF @Recipients IS NULL OR ISJSON(@Recipients) = 0 OR LEFT(LTRIM(@Recipients), 1) <> N'['
        SET @RecipientsOk = 0;
    ELSE IF (SELECT COUNT(*) FROM OPENJSON(@Recipients)) NOT BETWEEN 1 AND 1000
        SET @RecipientsOk = 0;
    ELSE IF EXISTS (SELECT 1 FROM OPENJSON(@Recipients) AS j WHERE j.[type] <> 5)
        SET @RecipientsOk = 0;
    IF @RecipientsOk = 0
        THROW 50609, N'@Recipients must be a JSON array of 1-1000 objects.', 1;
    -- The mail, when the token named one that still exists (a plain read:
    -- account, application and lists do not change after enqueue except by
    -- a suppression sweep, which only removes addresses).
    IF @MailID IS NOT NULL
        SELECT
            @KnownMail = q.ID, @Account = q.AccountName, @App = q.AppName,
            @To = q.ToAddress, @CC = q.CC, @BCC = q.BCC
        FROM mailq.MailQueue AS q
        WHERE q.ID = @MailID;
    IF @KnownMail IS NULL
    BEGIN
        SET @Account = @AccountName;
        IF @Account IS NULL OR NOT EXISTS (SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @Account)
        BEGIN
            SET @Msg = CONCAT(N'@AccountName ''', @AccountName, N''' is not a sending account, and the report ',
                N'names no queued mail (@MailID ', @MailID, N'): give the account the bounce mailbox serves.');
            THROW 50601, @Msg, 1;
        END;
    END;
    SET @TokenAddress = (
        SELECT TOP (1) CAST(r.Address AS NVARCHAR(320))
        FROM mailq.MailRecipientList(@To, @CC, @BCC) AS r
        WHERE r.RecipientNo = @RecipientNo AND r.IsFirst = 1 AND @KnownMail IS NOT NULL
    );
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RecordBounce: records what one delivery report says about its recipients
(`mailq-db bounces`), once per (report, address), and suppresses the addresses
that reached their limit: per new recipient a mailq.BounceReport row; with a
known mail an event (Bounced, BounceDelayed, Complained) and, for Hard and Soft,
the outcome Refused; a suppression (mailq.ApplySuppressions, account-wide) for a
Complaint at once, for Hard at @HardBounceLimit distinct mails, for Soft at
@SoftBounceLimit when set.  Delayed never suppresses.  A report read again changes nothing.
Parameters:  @ReportKey VARBINARY(32), required: SHA-256 of the report's Message-ID
             (else of its bytes); @Recipients NVARCHAR(MAX), required: JSON array of
             1-1000 {"address", "kind": Hard|Soft|Delayed|Complaint, "action",
             "status", "code" (200-599 or null), "detail"}; "address" may be left out
             (or be a forwarding alias) when @RecipientNo names the recipient;
             @Source NVARCHAR(200), required; @AccountName: the account when no mail
             is known (a known mail's account wins); @MailID BIGINT, @RecipientNo INT:
             from the verified VERP token (a purged mail counts as unknown);
             @HardBounceLimit INT 1-100 = 1; @SoftBounceLimit INT 1-100 = NULL (never).
Result set:  per recipient: Address, Kind, MailID, Recorded BIT (0: already
             recorded), Suppressed BIT (by this call).
Errors:      50601 no known mail and no valid @AccountName; 50602 a recipient
             without a valid address and no @RecipientNo; 50604 @Source; 50607
             @ReportKey not 32 bytes; 50608 a kind; 50609 @Recipients not a JSON
             array of 1-1000 objects; 50610 a limit out of range (50601, 50604,
             50607, 50609, 50610 checked by mailq.CheckBounceReport, before any write).
Transaction: its own if none is open, else the caller's; an error dooms either.
Isolation:   READ COMMITTED; the report key WITH (UPDLOCK, HOLDLOCK): two readers
             of one report record it once.
Lock order:  mailq.BounceReport, then mailq.ApplySuppressions's order, then the
             mail's row (mailq.MailQueue), mailq.MailRecipientOutcome, mailq.MailEvent.
Example:     EXEC mailq.RecordBounce @ReportKey = @Key, @Source = N'imap:bounces@example.com',
                 @MailID = 101, @Recipients = N'[{"address":"a@example.com","kind":"Hard"}]';
*/
CREATE OR ALTER PROCEDURE mailq.RecordBounce
    @ReportKey VARBINARY(32),
    @Recipients NVARCHAR(MAX),
    @Source NVARCHAR(200),
    @AccountName NVARCHAR(128) = NULL,
    @MailID BIGINT = NULL,
    @RecipientNo INT = NULL,
    @HardBounceLimit INT = 1,
    @SoftBounceLimit INT = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @HardBounceLimit = ISNULL(@HardBounceLimit, 1);
    DECLARE @Account NVARCHAR(128), @App NVARCHAR(128), @To NVARCHAR(4000), @CC NVARCHAR(4000),
        @BCC NVARCHAR(4000), @KnownMail BIGINT, @TokenAddress NVARCHAR(320);
    EXEC mailq.CheckBounceReport
        @ReportKey = @ReportKey,
        @Recipients = @Recipients,
        @Source = @Source,
        @AccountName = @AccountName,
        @MailID = @MailID,
        @RecipientNo = @RecipientNo,
        @HardBounceLimit = @HardBounceLimit,
        @SoftBounceLimit = @SoftBounceLimit,
        @KnownMail = @KnownMail OUTPUT,
        @Account = @Account OUTPUT,
        @App = @App OUTPUT,
        @To = @To OUTPUT,
        @CC = @CC OUTPUT,
        @BCC = @BCC OUTPUT,
        @TokenAddress = @TokenAddress OUTPUT;
    DECLARE @R TABLE (
        Address NVARCHAR(400) NULL,
        Kind NVARCHAR(16) NULL,
        Action NVARCHAR(16) NULL,
        Status NVARCHAR(16) NULL,
        SmtpCode INT NULL,
        Detail NVARCHAR(1000) NULL,
        Nth BIGINT NOT NULL
    );
    INSERT INTO @R (Address, Kind, Action, Status, SmtpCode, Detail, Nth)
    SELECT
        v.Address, v.Kind, v.Action, v.Status, v.SmtpCode, v.Detail,
        ROW_NUMBER() OVER (PARTITION BY v.Address ORDER BY v.Ordinal) AS Nth
    FROM (
        SELECT
            CAST(j.[key] AS INT) AS Ordinal,
            LEFT(LOWER(LTRIM(RTRIM(COALESCE(JSON_VALUE(j.[value], N'$.address'), @TokenAddress)))), 400) AS Address,
            LEFT(JSON_VALUE(j.[value], N'$.kind'), 16) AS Kind,
            LEFT(LOWER(JSON_VALUE(j.[value], N'$.action')), 16) AS Action,
            LEFT(JSON_VALUE(j.[value], N'$.status'), 16) AS Status,
            IIF(
                TRY_CAST(JSON_VALUE(j.[value], N'$.code') AS INT) BETWEEN 200 AND 599,
                TRY_CAST(JSON_VALUE(j.[value], N'$.code') AS INT), NULL
            ) AS SmtpCode,
            LEFT(JSON_VALUE(j.[value], N'$.detail'), 1000) AS Detail
        FROM OPENJSON(@Recipients) AS j
    ) AS v;
    -- A report about one recipient that is not among the mail's (a forwarding
    -- alias: the Final-Recipient after expansion) is about the address the
    -- token names: that is the one the queue sent to and must suppress.
    IF @TokenAddress IS NOT NULL AND (SELECT COUNT(*) FROM @R) = 1
        UPDATE r
        SET r.Address = @TokenAddress
        FROM @R AS r
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.MailRecipientList(@To, @CC, @BCC) AS l
            WHERE l.Address = r.Address
        );
    SELECT TOP (1) @Msg = CONCAT(N'@Recipients: ',
        COALESCE(N'''' + r.Address + N'''', N'a recipient without "address"'),
        N' is not one address of 1-320 characters',
        IIF(r.Address IS NULL, N', and @RecipientNo names no recipient of a queued mail', N''), N'.')
    FROM @R AS r
    WHERE r.Address IS NULL OR LEN(r.Address) > 320 OR r.Address NOT LIKE N'%_@_%' OR r.Address LIKE N'%@%@%';
    IF @Msg IS NOT NULL THROW 50602, @Msg, 1;
    SELECT TOP (1) @Msg = CONCAT(N'@Recipients: the kind of ', r.Address, N' is ',
        COALESCE(N'''' + r.Kind + N'''', N'missing'), N'; it must be Hard, Soft, Delayed or Complaint.')
    FROM @R AS r
    WHERE r.Kind IS NULL OR r.Kind NOT IN (N'Hard', N'Soft', N'Delayed', N'Complaint');
    IF @Msg IS NOT NULL THROW 50608, @Msg, 1;
    DELETE FROM @R WHERE Nth > 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @New TABLE (Address NVARCHAR(320) NOT NULL PRIMARY KEY);
    DECLARE @Suppress TABLE (Address NVARCHAR(320) NOT NULL PRIMARY KEY, Reason NVARCHAR(16) NOT NULL);
    DECLARE @Suppressions NVARCHAR(MAX), @Status NVARCHAR(16), @AttemptCount INT;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- 1. The idempotency key: (report, address) recorded once.
        INSERT INTO mailq.BounceReport (
            ReportKey, Address, AccountName, AppName, MailID, Kind, Action, Status, SmtpCode, Detail, Source,
            ReceivedAtUtc
        )
        OUTPUT inserted.Address INTO @New (Address)
        SELECT
            @ReportKey, r.Address, @Account, @App, @KnownMail, r.Kind, r.Action, r.Status, r.SmtpCode, r.Detail,
            @Source, @Now
        FROM @R AS r
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.BounceReport AS b WITH (UPDLOCK, HOLDLOCK)
            WHERE b.ReportKey = @ReportKey AND b.Address = r.Address
        );
        -- 2. Which of the new ones reach their limit (the counts include them): one per mail, so two
        --    reports of one bounce (a DSN and an SES notification) count once; a report without mail counts alone.
        INSERT INTO @Suppress (Address, Reason)
        SELECT
            r.Address,
            CASE r.Kind WHEN N'Complaint' THEN N'Complaint' WHEN N'Hard' THEN N'HardBounce' ELSE N'SoftBounce' END
        FROM @R AS r
        INNER JOIN @New AS n ON r.Address = n.Address
        WHERE
            r.Kind = N'Complaint'
            OR (r.Kind = N'Hard' AND (
                SELECT COUNT(DISTINCT COALESCE(CAST(b.MailID AS VARBINARY(8)), b.ReportKey))
                FROM mailq.BounceReport AS b
                WHERE b.AccountName = @Account AND b.Address = r.Address AND b.Kind = N'Hard'
            ) >= @HardBounceLimit)
            OR (r.Kind = N'Soft' AND @SoftBounceLimit IS NOT NULL AND (
                SELECT COUNT(DISTINCT COALESCE(CAST(b.MailID AS VARBINARY(8)), b.ReportKey))
                FROM mailq.BounceReport AS b
                WHERE b.AccountName = @Account AND b.Address = r.Address AND b.Kind = N'Soft'
            ) >= @SoftBounceLimit);
        IF EXISTS (SELECT 1 FROM @Suppress)
        BEGIN
            SET @Suppressions = (
                SELECT
                    @Account AS AccountName,
                    s.Address,
                    s.Reason,
                    @Source AS Source,
                    LEFT(CONCAT(r.Kind, N' ', r.Status, N': ', r.Detail), 1000) AS Detail,
                    @KnownMail AS MailID
                FROM @Suppress AS s
                INNER JOIN @R AS r ON s.Address = r.Address
                FOR JSON PATH
            );
            EXEC mailq.ApplySuppressions @Suppressions = @Suppressions;
        END;
        -- 3. The reported mail: its recipients' outcomes and its events.
        IF @KnownMail IS NOT NULL AND EXISTS (SELECT 1 FROM @New)
        BEGIN
            SELECT @Status = q.Status, @AttemptCount = q.AttemptCount
            FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
            WHERE q.ID = @KnownMail;
            UPDATE o
            SET
                o.Outcome = N'Refused',
                o.SmtpCode = r.SmtpCode,
                o.SmtpText = LEFT(CONCAT(N'bounced later (', r.Status, N'): ', r.Detail), 1000),
                o.UpdatedAtUtc = @Now
            FROM mailq.MailRecipientOutcome AS o
            INNER JOIN @R AS r ON o.Address = r.Address
            INNER JOIN @New AS n ON r.Address = n.Address
            WHERE o.MailID = @KnownMail AND r.Kind IN (N'Hard', N'Soft');
            INSERT INTO mailq.MailRecipientOutcome (
                MailID, Address, Outcome, SmtpCode, SmtpText, AttemptNo, UpdatedAtUtc
            )
            SELECT
                @KnownMail, r.Address, N'Refused', r.SmtpCode,
                LEFT(CONCAT(N'bounced later (', r.Status, N'): ', r.Detail), 1000), @AttemptCount, @Now
            FROM @R AS r
            INNER JOIN @New AS n ON r.Address = n.Address
            WHERE
                r.Kind IN (N'Hard', N'Soft')
                AND NOT EXISTS (
                    SELECT 1
                    FROM mailq.MailRecipientOutcome AS o
                    WHERE o.MailID = @KnownMail AND o.Address = r.Address
                );
            INSERT INTO mailq.MailEvent (
                MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc
            )
            SELECT
                @KnownMail, @App,
                CASE r.Kind WHEN N'Delayed' THEN N'BounceDelayed' WHEN N'Complaint' THEN N'Complained'
                    ELSE N'Bounced' END,
                @Status, @AttemptCount, r.SmtpCode,
                LEFT(CONCAT(r.Address, N': ', r.Kind, N' ', r.Status, N' ', r.Detail), 4000), @Now
            FROM @R AS r
            INNER JOIN @New AS n ON r.Address = n.Address;
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT
        r.Address,
        r.Kind,
        @KnownMail AS MailID,
        CAST(IIF(n.Address IS NULL, 0, 1) AS BIT) AS Recorded,
        CAST(IIF(s.Address IS NULL, 0, 1) AS BIT) AS Suppressed
    FROM @R AS r
    LEFT JOIN @New AS n ON r.Address = n.Address
    LEFT JOIN @Suppress AS s ON r.Address = s.Address
    ORDER BY r.Address;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RecordUnsubscribe: a recipient asked for no more of this mail's stream
(RFC 8058 one-click POST, or List-Unsubscribe mailto: read by the bounce reader;
the caller verified the signed token): suppresses the address for the mail's
application (the whole account when it has none), records a mailq.BounceReport
row (Kind Unsubscribe) and the event Unsubscribed.  Idempotent per (mail,
recipient); re-applies the suppression only if an operator removed it since.
Parameters:  @MailID BIGINT, required; @RecipientNo INT, required: 1-based
             (mailq.MailRecipientList); @Source NVARCHAR(200), required.
Result set:  one row: MailID, AccountName, AppName, Address, Recorded BIT (0:
             already unsubscribed from this mail).
Errors:      50604 @Source missing or over 200 characters; 50611 no such mail
             (unknown, or purged: docs/bounces.md); 50612 @RecipientNo not a
             recipient number of that mail.
Transaction: its own if none is open, else the caller's; an error dooms either.
Isolation:   READ COMMITTED; the report key WITH (UPDLOCK, HOLDLOCK): two clicks
             record one unsubscribe.
Lock order:  mailq.BounceReport, then mailq.ApplySuppressions's order, then mailq.MailEvent.
Example:     EXEC mailq.RecordUnsubscribe @MailID = 101, @RecipientNo = 1, @Source = N'unsubscribe-url';
*/
CREATE OR ALTER PROCEDURE mailq.RecordUnsubscribe
    @MailID BIGINT,
    @RecipientNo INT,
    @Source NVARCHAR(200)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF NULLIF(LTRIM(RTRIM(@Source)), N'') IS NULL
        THROW 50604, N'@Source is required (1-200 characters): how the unsubscribe arrived.', 1;
    DECLARE @Account NVARCHAR(128), @App NVARCHAR(128), @To NVARCHAR(4000), @CC NVARCHAR(4000),
        @BCC NVARCHAR(4000), @Known BIGINT, @Status NVARCHAR(16), @AttemptCount INT;
    SELECT
        @Known = q.ID, @Account = q.AccountName, @App = q.AppName,
        @To = q.ToAddress, @CC = q.CC, @BCC = q.BCC
    FROM mailq.MailQueue AS q
    WHERE q.ID = @MailID;
    IF @Known IS NULL
    BEGIN
        SET @Msg = CONCAT(
            N'Mail ', @MailID, N' does not exist (purged?): the unsubscribe cannot be tied to an address.'
        );
        THROW 50611, @Msg, 1;
    END;
    -- Tokens name a recipient only for a mail with one recipient (number 1):
    -- a sweep never renumbers such a mail (it stops it instead).
    DECLARE @Address NVARCHAR(320) = (
        SELECT TOP (1) CAST(r.Address AS NVARCHAR(320))
        FROM mailq.MailRecipientList(@To, @CC, @BCC) AS r
        WHERE r.RecipientNo = @RecipientNo AND r.IsFirst = 1 AND LEN(r.Address) <= 320
    );
    IF @Address IS NULL
    BEGIN
        SET @Msg = CONCAT(N'@RecipientNo ', COALESCE(CAST(@RecipientNo AS NVARCHAR(12)), N'NULL'),
            N' is not a recipient number of mail ', @MailID, N'.');
        THROW 50612, @Msg, 1;
    END;
    DECLARE @Key VARBINARY(32) = HASHBYTES('SHA2_256', CONCAT(N'unsubscribe:', @MailID, N':', @RecipientNo));
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Recorded BIT = 0;
    DECLARE @Suppressions NVARCHAR(MAX);
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        INSERT INTO mailq.BounceReport (
            ReportKey, Address, AccountName, AppName, MailID, Kind, Action, Status, SmtpCode, Detail, Source,
            ReceivedAtUtc
        )
        SELECT @Key, @Address, @Account, @App, @MailID, N'Unsubscribe', NULL, NULL, NULL, NULL, @Source, @Now
        WHERE NOT EXISTS (
            SELECT 1
            FROM mailq.BounceReport AS b WITH (UPDLOCK, HOLDLOCK)
            WHERE b.ReportKey = @Key AND b.Address = @Address
        );
        SET @Recorded = IIF(@@ROWCOUNT = 1, 1, 0);
        IF @Recorded = 1 OR NOT EXISTS (
            SELECT 1
            FROM mailq.Suppression AS s
            WHERE
                s.AccountName = @Account AND s.Address = @Address AND s.AppName IN (N'', ISNULL(@App, N''))
                AND (s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @Now)
        )
        BEGIN
            SET @Suppressions = (
                SELECT
                    @Account AS AccountName,
                    @Address AS Address,
                    @App AS AppName,
                    N'Unsubscribe' AS Reason,
                    @Source AS Source,
                    CONCAT(N'unsubscribed from mail ', @MailID) AS Detail,
                    @MailID AS MailID
                FOR JSON PATH
            );
            EXEC mailq.ApplySuppressions @Suppressions = @Suppressions;
        END;
        IF @Recorded = 1
        BEGIN
            SELECT @Status = q.Status, @AttemptCount = q.AttemptCount
            FROM mailq.MailQueue AS q
            WHERE q.ID = @MailID;
            INSERT INTO mailq.MailEvent (
                MailID, AppName, EventType, Status, AttemptCount, SmtpCode, Detail, OccurredAtUtc
            )
            VALUES (
                @MailID, @App, N'Unsubscribed', @Status, @AttemptCount, NULL,
                LEFT(CONCAT(@Address, N' (', @Source, N')'), 4000), @Now
            );
        END;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT @MailID AS MailID, @Account AS AccountName, @App AS AppName, @Address AS Address, @Recorded AS Recorded;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.AddSuppression: suppresses an address for a sending account (or one of
its applications) and takes it out of the mail already queued for it
(mailq.ApplySuppressions).  Adding an existing suppression renews it.
Parameters:  @AccountName NVARCHAR(128), required; @Address NVARCHAR(320), required
             (stored lower-case); @Reason NVARCHAR(16) = 'Manual' (Manual, HardBounce,
             SoftBounce, Complaint, Unsubscribe); @Source NVARCHAR(200), required
             (who); @AppName NVARCHAR(128) = NULL (every application); @Detail
             NVARCHAR(1000) = NULL; @ExpiresAtUtc DATETIME2(3) = NULL (forever).
Result set:  one row: AccountName, AppName, Address, Reason, SweptMails INT,
             StoppedMails INT (stopped because nobody was left).
Errors:      50601 @AccountName not a sending account; 50602 @Address not one
             address of 1-320 characters; 50603 @Reason; 50604 @Source missing or
             over 200 characters; 50605 @ExpiresAtUtc not in the future; 50606
             @AppName not a registered application.
Transaction: its own if none is open, else the caller's; an error dooms either.
Isolation:   validation reads before the transaction; writes as ApplySuppressions.
Lock order:  mailq.ApplySuppressions's.
Example:     EXEC mailq.AddSuppression @AccountName = N'news', @Address = N'old@example.com',
                 @Source = N'dba:alice', @Detail = N'Customer asked by phone.';
*/
CREATE OR ALTER PROCEDURE mailq.AddSuppression
    @AccountName NVARCHAR(128),
    @Address NVARCHAR(400),
    @Source NVARCHAR(200),
    @Reason NVARCHAR(16) = N'Manual',
    @AppName NVARCHAR(128) = NULL,
    @Detail NVARCHAR(1000) = NULL,
    @ExpiresAtUtc DATETIME2(3) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @Reason = ISNULL(@Reason, N'Manual');
    SET @Address = LOWER(LTRIM(RTRIM(@Address)));
    IF @AccountName IS NULL OR NOT EXISTS (
        SELECT 1 FROM mailq.SendingAccount AS a WHERE a.AccountName = @AccountName
    )
    BEGIN
        SET @Msg = CONCAT(N'@AccountName ''', @AccountName, N''' is not a sending account.');
        THROW 50601, @Msg, 1;
    END;
    IF @Address IS NULL OR LEN(@Address) > 320 OR @Address NOT LIKE N'%_@_%' OR @Address LIKE N'%@%@%'
        OR @Address LIKE N'%[ ;,<>]%'
    BEGIN
        SET @Msg = CONCAT(N'@Address ''', @Address, N''' is not one address of 1-320 characters.');
        THROW 50602, @Msg, 1;
    END;
    IF @Reason NOT IN (N'Manual', N'HardBounce', N'SoftBounce', N'Complaint', N'Unsubscribe')
    BEGIN
        SET @Msg = CONCAT(N'@Reason is ''', @Reason, N'''; it must be Manual, HardBounce, SoftBounce, ',
            N'Complaint or Unsubscribe.');
        THROW 50603, @Msg, 1;
    END;
    IF NULLIF(LTRIM(RTRIM(@Source)), N'') IS NULL
        THROW 50604, N'@Source is required (1-200 characters): who adds the suppression.', 1;
    IF @ExpiresAtUtc <= SYSUTCDATETIME()
    BEGIN
        SET @Msg = CONCAT(N'@ExpiresAtUtc must be in the future (UTC); got ',
            CONVERT(NVARCHAR(30), @ExpiresAtUtc, 126), N'.');
        THROW 50605, @Msg, 1;
    END;
    IF @AppName IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mailq.Application AS a WHERE a.AppName = @AppName)
    BEGIN
        SET @Msg = CONCAT(N'@AppName ''', @AppName, N''' is not a registered application.');
        THROW 50606, @Msg, 1;
    END;
    DECLARE @Suppressions NVARCHAR(MAX) = (
        SELECT
            @AccountName AS AccountName,
            @Address AS Address,
            @AppName AS AppName,
            @Reason AS Reason,
            @Source AS Source,
            @Detail AS Detail,
            CONVERT(NVARCHAR(30), @ExpiresAtUtc, 126) AS ExpiresAtUtc
        FOR JSON PATH
    );
    DECLARE @Swept INT, @Stopped INT;
    -- mailq.ApplySuppressions owns or joins the transaction itself (one call).
    EXEC mailq.ApplySuppressions @Suppressions = @Suppressions, @SweptMails = @Swept OUTPUT,
        @StoppedMails = @Stopped OUTPUT;
    SELECT
        @AccountName AS AccountName,
        @AppName AS AppName,
        @Address AS Address,
        @Reason AS Reason,
        @Swept AS SweptMails,
        @Stopped AS StoppedMails;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.RemoveSuppression: the address may be mailed again by the account (or
the one application): deletes the suppression and records who removed it
and why in mailq.SuppressionHistory.  Mail swept while it applied keeps its
lists (or stays Stopped: mailq.RequeueMail puts it back).  Removing a
suppression that does not exist changes nothing (Removed = 0).
Parameters:  @AccountName NVARCHAR(128), required; @Address NVARCHAR(320),
             required; @Source NVARCHAR(200), required: who removes it;
             @AppName NVARCHAR(128), default NULL: the account-wide row; a
             name: that application's row; @Detail NVARCHAR(1000): why.
Result set:  one row: Removed INT (0 or 1).
Errors:      50601 @AccountName missing; 50602 @Address missing or over 320
             characters; 50604 @Source missing or over 200 characters.
Transaction: opens its own if none is open, else works inside the caller's;
             an error dooms either (XACT_ABORT ON) and is re-raised.
Isolation:   sets READ COMMITTED itself (the row read WITH (UPDLOCK, HOLDLOCK), then deleted).
Lock order:  mailq.Suppression, then mailq.SuppressionHistory.
Example:     EXEC mailq.RemoveSuppression @AccountName = N'news', @Address = N'old@example.com',
                 @Source = N'dba:alice', @Detail = N'The customer fixed the mailbox.';
*/
CREATE OR ALTER PROCEDURE mailq.RemoveSuppression
    @AccountName NVARCHAR(128),
    @Address NVARCHAR(400),
    @Source NVARCHAR(200),
    @AppName NVARCHAR(128) = NULL,
    @Detail NVARCHAR(1000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF NULLIF(@AccountName, N'') IS NULL
        THROW 50601, N'@AccountName is required.', 1;
    SET @Address = LOWER(LTRIM(RTRIM(@Address)));
    IF NULLIF(@Address, N'') IS NULL OR LEN(@Address) > 320
        THROW 50602, N'@Address is required: one address of 1-320 characters.', 1;
    IF NULLIF(LTRIM(RTRIM(@Source)), N'') IS NULL
        THROW 50604, N'@Source is required (1-200 characters): who removes the suppression.', 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Removed INT = 0;
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        -- History first, then the delete (not OUTPUT INTO: CK_SuppressionHistory_Action forbids it, Msg 333).
        INSERT INTO mailq.SuppressionHistory (
            AccountName, Address, AppName, Action, Reason, Source, Detail, MailID, OccurredAtUtc
        )
        SELECT s.AccountName, s.Address, s.AppName, N'Removed', s.Reason, @Source, LEFT(@Detail, 1000), s.MailID, @Now
        FROM mailq.Suppression AS s WITH (UPDLOCK, HOLDLOCK)
        WHERE s.AccountName = @AccountName AND s.Address = @Address AND s.AppName = ISNULL(@AppName, N'');
        DELETE s
        FROM mailq.Suppression AS s
        WHERE s.AccountName = @AccountName AND s.Address = @Address AND s.AppName = ISNULL(@AppName, N'');
        SET @Removed = @@ROWCOUNT;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
    SELECT @Removed AS Removed;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ListSuppressions: the suppression list, newest change first, for an
operator or an export (`mailq-db suppressions list`).
Parameters:  @AccountName NVARCHAR(128), default NULL: every account;
             @Address NVARCHAR(320), default NULL: every address (with
             @AccountName: one seek on PK_Suppression);
             @Reason NVARCHAR(16), default NULL: every reason;
             @IncludeExpired BIT, default 0;
             @MaxRows INT 1-100000, default 1000.
Result set:  AccountName, AppName (NULL: every application of the account),
             Address, Reason, Source, Detail, MailID, CreatedAtUtc,
             UpdatedAtUtc, ExpiresAtUtc, IsActive BIT.
Errors:      50613 @MaxRows out of range.
Transaction: none of its own; reads only.
Isolation:   sets READ COMMITTED itself (no key-range locks under a SERIALIZABLE
             caller, no stale snapshot under SNAPSHOT; a report, locks kept by none).
Reads:       mailq.SuppressionsAsOf(@Now), the rules of the view mailq.Suppressions.
Lock order:  mailq.Suppression only.
Example:     EXEC mailq.ListSuppressions @AccountName = N'news', @Reason = N'Complaint';
*/
CREATE OR ALTER PROCEDURE mailq.ListSuppressions
    @AccountName NVARCHAR(128) = NULL,
    @Address NVARCHAR(400) = NULL,
    @Reason NVARCHAR(16) = NULL,
    @IncludeExpired BIT = 0,
    @MaxRows INT = 1000
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @MaxRows = ISNULL(@MaxRows, 1000);
    IF @MaxRows NOT BETWEEN 1 AND 100000
    BEGIN
        SET @Msg = CONCAT(N'@MaxRows must be 1-100000; got ', @MaxRows, N'.');
        THROW 50613, @Msg, 1;
    END;
    SET @Address = LOWER(LTRIM(RTRIM(@Address)));
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    SELECT TOP (@MaxRows)
        s.AccountName,
        s.AppName,
        s.Address,
        s.Reason,
        s.Source,
        s.Detail,
        s.MailID,
        s.CreatedAtUtc,
        s.UpdatedAtUtc,
        s.ExpiresAtUtc,
        s.IsActive
    FROM mailq.SuppressionsAsOf(@Now) AS s
    WHERE
        (@AccountName IS NULL OR s.AccountName = @AccountName)
        AND (@Address IS NULL OR s.Address = @Address)
        AND (@Reason IS NULL OR s.Reason = @Reason)
        AND (ISNULL(@IncludeExpired, 0) = 1 OR s.IsActive = 1)
    ORDER BY s.UpdatedAtUtc DESC, s.AccountName ASC, s.Address ASC
    OPTION (RECOMPILE);  -- optional filters: a plan per call, so a given account+address seeks
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetSuppressionStats: what `mailq-db stats` and `mailq-db doctor` show
about bounces and suppressions.
Parameters:  @Days INT 1-366, default 7: the window of the report counts.
Result sets: 1. active suppressions: AccountName, Reason, Suppressed INT
                (one scan of mailq.Suppression: a report, not a hot path);
             2. reports recorded in the last @Days days: AccountName, Kind,
                Reports INT, Mails INT (distinct mails they were tied to),
                LastAtUtc (a range seek on IX_BounceReport_ReceivedAtUtc);
             3. mail Sent in the same window, the denominator of bounce and
                complaint rates: AccountName, Sent INT (a range seek on
                IX_MailQueue_Final by DateProcessed, covering).
Errors:      50614 @Days out of range.
Transaction: none of its own; reads only.
Isolation:   sets READ COMMITTED itself (no key-range locks under a SERIALIZABLE
             caller, no stale snapshot under SNAPSHOT; a report, locks kept by none).
Lock order:  mailq.Suppression, mailq.BounceReport, then mailq.MailQueue.
Example:     EXEC mailq.GetSuppressionStats @Days = 1;
*/
CREATE OR ALTER PROCEDURE mailq.GetSuppressionStats
    @Days INT = 7
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @Days = ISNULL(@Days, 7);
    IF @Days NOT BETWEEN 1 AND 366
    BEGIN
        SET @Msg = CONCAT(N'@Days must be 1-366; got ', @Days, N'.');
        THROW 50614, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @Since DATETIME2(3) = DATEADD(DAY, -@Days, @Now);
    SELECT s.AccountName, s.Reason, COUNT(*) AS Suppressed
    FROM mailq.Suppression AS s
    WHERE s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @Now
    GROUP BY s.AccountName, s.Reason
    ORDER BY s.AccountName, s.Reason;
    SELECT
        b.AccountName,
        b.Kind,
        COUNT(*) AS Reports,
        COUNT(DISTINCT b.MailID) AS Mails,
        MAX(b.ReceivedAtUtc) AS LastAtUtc
    FROM mailq.BounceReport AS b
    WHERE b.ReceivedAtUtc >= @Since
    GROUP BY b.AccountName, b.Kind
    ORDER BY b.AccountName, b.Kind;
    SELECT q.AccountName, COUNT(*) AS Sent
    FROM mailq.MailQueue AS q
    WHERE
        q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')  -- IX_MailQueue_Final's filter
        AND q.DateProcessed >= @Since AND q.Status = N'Sent'
    GROUP BY q.AccountName
    ORDER BY q.AccountName;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.PurgeBounceReports: deletes bounce, complaint and unsubscribe reports
(mailq.BounceReport) older than @OlderThanDays days, @BatchSize rows per
transaction, oldest first (a range of IX_BounceReport_ReceivedAtUtc).  The
suppressions they caused stay; the hard/soft bounce counts of
mailq.RecordBounce then count only what is kept, so the retention is also
the window of those counts (docs/bounces.md).
Parameters:  @OlderThanDays INT 1-36500, required; @BatchSize INT 1-1000, default 1000.
Result set:  one row: PurgedCount BIGINT.
Errors:      50615 @OlderThanDays out of range; 50616 @BatchSize out of range;
             50617 called inside a transaction.
Transaction: must not be called inside one (50617): each batch commits on its
             own; an error rolls back the current batch only and is re-raised.
Isolation:   sets READ COMMITTED itself.  Batches of at most 1,000 rows stay
             far below the 5,000 locks of lock escalation.
Lock order:  mailq.BounceReport only.
Example:     EXEC mailq.PurgeBounceReports @OlderThanDays = 365;
*/
CREATE OR ALTER PROCEDURE mailq.PurgeBounceReports
    @OlderThanDays INT,
    @BatchSize INT = 1000
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @OlderThanDays IS NULL OR @OlderThanDays NOT BETWEEN 1 AND 36500
    BEGIN
        SET @Msg = CONCAT(N'@OlderThanDays must be 1-36500; got ',
            COALESCE(CAST(@OlderThanDays AS NVARCHAR(12)), N'NULL'), N'.');
        THROW 50615, @Msg, 1;
    END;
    SET @BatchSize = ISNULL(@BatchSize, 1000);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50616, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50617, N'mailq.PurgeBounceReports commits batch by batch: call it outside a transaction.', 1;
    DECLARE @Cutoff DATETIME2(3) = DATEADD(DAY, -@OlderThanDays, SYSUTCDATETIME());
    DECLARE @Purged BIGINT = 0;
    DECLARE @Deleted INT = 1;
    WHILE @Deleted > 0
    BEGIN
        BEGIN TRY
            BEGIN TRANSACTION;
            WITH Oldest AS (
                SELECT TOP (@BatchSize) b.ReportKey, b.Address, b.ReceivedAtUtc
                FROM mailq.BounceReport AS b
                WHERE b.ReceivedAtUtc < @Cutoff
                ORDER BY b.ReceivedAtUtc
            )

            DELETE FROM Oldest;
            SET @Deleted = @@ROWCOUNT;
            SET @Purged += @Deleted;
            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;
    END;
    SELECT @Purged AS PurgedCount;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Grants for bounces, complaints, unsubscribes and suppression (docs/bounces.md):
the bounce reader role records; administrators also list, add, remove,
purge and read the views.  mailq.ApplySuppressions and mailq.CheckBounceReport
are internal (reached through ownership chaining only) and granted to nobody; enqueuers need no
grant for mailq.FilterSuppressedRecipients, which the enqueue core
(mailq.EnqueueMailRows) calls.
*/
GRANT EXECUTE ON OBJECT::mailq.RecordBounce TO MailqBounceReader;
GRANT EXECUTE ON OBJECT::mailq.RecordUnsubscribe TO MailqBounceReader;
GRANT EXECUTE ON OBJECT::mailq.RecordBounce TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RecordUnsubscribe TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.AddSuppression TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RemoveSuppression TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ListSuppressions TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetSuppressionStats TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.PurgeBounceReports TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.Suppressions TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecentBounceReports TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqMonitor: read-only monitoring (`mailq-db exporter`, `mailq-db dashboard`);
no procedure that changes a mail or an account.
*/
IF DATABASE_PRINCIPAL_ID(N'MailqMonitor') IS NULL
    CREATE ROLE MailqMonitor AUTHORIZATION dbo;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetQueueMetrics: the queue's own metrics in one cheap call, for
`mailq-db exporter` and `mailq-db dashboard` (docs/monitoring/README.md).
Parameters:  @WindowMinutes INT 1-60 = 5: complete UTC minutes before now (set 5)
Result sets: 1. MeasuredAtUtc, WindowStartUtc, WindowEndUtc, CallerIsMailqAdmin
             2. depth: AccountName, RunMode, Status (UnSent, Sending), MailCount
             3. per (account, run mode): DueCount (the claim's test), IsBlocked,
                SendableCount (0 when blocked), OldestSendableUtc,
                OldestSendableAgeSeconds (0 when nothing is sendable)
             4. accounts: AccountName, IsBlocked, BlockedUntilUtc, BlockedSecondsLeft,
                BlockReason, PerMinuteLimit, PerHourLimit, PerDayLimit
             5. attempts ended in the window: MinuteUtc, AccountName, Outcome,
                ReplyClass ('2xx', '4xx', '5xx', 'none'), Attempts
             6. suppressions in force: AccountName, Reason, Suppressed
Cost:        queued mail + mail in flight + attempts in the window + suppressed
             addresses (forced seeks and small scans); never the sent history.
Errors:      50580 @WindowMinutes out of range.
Transaction: reads only; opens none.
Isolation:   READ COMMITTED, set here (no lock kept past a statement).
Lock order:  none (no locking reads).
Example:     EXEC mailq.GetQueueMetrics @WindowMinutes = 5;
*/
CREATE OR ALTER PROCEDURE mailq.GetQueueMetrics
    @WindowMinutes INT = 5
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @WindowMinutes = COALESCE(@WindowMinutes, 5);
    IF @WindowMinutes NOT BETWEEN 1 AND 60
    BEGIN
        SET @Msg = CONCAT(N'@WindowMinutes must be 1-60; got ', @WindowMinutes, N'.');
        THROW 50580, @Msg, 1;
    END;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @WindowEnd DATETIME2(3) = DATEADD(
        MINUTE, DATEDIFF(MINUTE, '20000101', @Now), CAST('20000101' AS DATETIME2(3))
    );
    DECLARE @WindowStart DATETIME2(3) = DATEADD(MINUTE, -@WindowMinutes, @WindowEnd);
    DECLARE @Pair TABLE (
        AccountName NVARCHAR(128) NOT NULL,
        RunMode NVARCHAR(32) NOT NULL,
        MailCount BIGINT NOT NULL,
        DueCount BIGINT NOT NULL,
        OldestDueUtc DATETIME2(3) NULL,
        SendingCount BIGINT NOT NULL DEFAULT (0),
        PRIMARY KEY (AccountName, RunMode)
    );
    -- The claim's index, filtered to UnSent and Sending: the literal Status list
    -- matches the filter, INDEX keeps it whatever the statistics say.
    INSERT INTO @Pair (AccountName, RunMode, MailCount, DueCount, OldestDueUtc)
    SELECT
        k.AccountName,
        k.RunMode,
        COUNT_BIG(*),
        SUM(IIF(k.VisibleAtUtc <= @Now AND k.AttemptsRemaining > 0
            AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now), CAST(1 AS BIGINT), CAST(0 AS BIGINT))),
        MIN(IIF(k.VisibleAtUtc <= @Now AND k.AttemptsRemaining > 0
            AND (k.ExpiresAtUtc IS NULL OR k.ExpiresAtUtc > @Now), k.VisibleAtUtc, NULL))
    FROM mailq.MailQueue AS k WITH (INDEX (IX_MailQueue_ClaimByAccount))
    WHERE k.Status IN (N'UnSent', N'Sending')
    GROUP BY k.AccountName, k.RunMode;
    -- In flight: a seek on IX_MailQueue_Status's Sending range, one lookup per mail.
    UPDATE p
    SET p.SendingCount = s.SendingCount
    FROM @Pair AS p
    INNER JOIN (
        SELECT q.AccountName, q.RunMode, COUNT_BIG(*) AS SendingCount
        FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Status), FORCESEEK)
        WHERE q.Status = N'Sending'
        GROUP BY q.AccountName, q.RunMode
    ) AS s ON p.AccountName = s.AccountName AND p.RunMode = s.RunMode;
    SELECT
        @Now AS MeasuredAtUtc,
        @WindowStart AS WindowStartUtc,
        @WindowEnd AS WindowEndUtc,
        CAST(IIF(IS_ROLEMEMBER(N'MailqAdmin') = 1 OR IS_ROLEMEMBER(N'db_owner') = 1, 1, 0) AS BIT)
        AS CallerIsMailqAdmin;
    SELECT
        d.AccountName,
        d.RunMode,
        d.Status,
        d.MailCount
    FROM (
        SELECT p.AccountName, p.RunMode, N'UnSent' AS Status, p.MailCount - p.SendingCount AS MailCount
        FROM @Pair AS p
        UNION ALL
        SELECT p.AccountName, p.RunMode, N'Sending' AS Status, p.SendingCount AS MailCount
        FROM @Pair AS p
    ) AS d
    ORDER BY d.AccountName, d.RunMode, d.Status;
    SELECT
        p.AccountName,
        p.RunMode,
        p.DueCount,
        CAST(IIF(a.BlockedUntilUtc > @Now, 1, 0) AS BIT) AS IsBlocked,
        IIF(a.BlockedUntilUtc > @Now, CAST(0 AS BIGINT), p.DueCount) AS SendableCount,
        IIF(a.BlockedUntilUtc > @Now, NULL, p.OldestDueUtc) AS OldestSendableUtc,
        IIF(
            a.BlockedUntilUtc > @Now OR p.OldestDueUtc IS NULL,
            CAST(0 AS BIGINT),
            DATEDIFF_BIG(SECOND, p.OldestDueUtc, @Now)
        ) AS OldestSendableAgeSeconds
    FROM @Pair AS p
    INNER JOIN mailq.SendingAccount AS a ON p.AccountName = a.AccountName
    ORDER BY p.AccountName, p.RunMode;
    SELECT
        a.AccountName,
        CAST(IIF(a.BlockedUntilUtc > @Now, 1, 0) AS BIT) AS IsBlocked,
        a.BlockedUntilUtc,
        IIF(a.BlockedUntilUtc > @Now, DATEDIFF_BIG(SECOND, @Now, a.BlockedUntilUtc), CAST(0 AS BIGINT))
        AS BlockedSecondsLeft,
        IIF(a.BlockedUntilUtc > @Now, a.BlockReason, NULL) AS BlockReason,
        a.PerMinuteLimit,
        a.PerHourLimit,
        a.PerDayLimit
    FROM mailq.SendingAccount AS a
    ORDER BY a.AccountName;
    -- A range seek on IX_MailAttempt_EndedAtUtc (the explicit IS NOT NULL lets
    -- the hint match its filter), one PK seek per attempt for the account.
    SELECT
        m.MinuteUtc,
        q.AccountName,
        m.Outcome,
        m.ReplyClass,
        COUNT_BIG(*) AS Attempts
    FROM (
        SELECT
            t.MailID,
            t.Outcome,
            DATEADD(MINUTE, DATEDIFF(MINUTE, '20000101', t.EndedAtUtc), CAST('20000101' AS DATETIME2(0)))
            AS MinuteUtc,
            IIF(t.SmtpCode IS NULL, N'none', CONCAT(t.SmtpCode / 100, N'xx')) AS ReplyClass
        FROM mailq.MailAttempt AS t WITH (INDEX (IX_MailAttempt_EndedAtUtc), FORCESEEK)
        WHERE
            t.EndedAtUtc IS NOT NULL
            AND t.EndedAtUtc >= @WindowStart
            AND t.EndedAtUtc < @WindowEnd
    ) AS m
    INNER JOIN mailq.MailQueue AS q ON m.MailID = q.ID
    GROUP BY m.MinuteUtc, q.AccountName, m.Outcome, m.ReplyClass
    ORDER BY m.MinuteUtc, q.AccountName, m.Outcome, m.ReplyClass;
    -- mailq.Suppression is small: one scan of its clustered key.
    SELECT s.AccountName, s.Reason, COUNT_BIG(*) AS Suppressed
    FROM mailq.Suppression AS s
    WHERE s.ExpiresAtUtc IS NULL OR s.ExpiresAtUtc > @Now
    GROUP BY s.AccountName, s.Reason
    ORDER BY s.AccountName, s.Reason;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.GetMailHistory: one mail's story for `mailq-db dashboard` (its events: mailq.GetMailEvents).
Parameters:  @MailID BIGINT, required; an unknown ID returns three empty sets.
Result sets: 1. the mail (dtStamp as EnqueuedAtUtc); 2. its attempts, in order (ErrorText of
             a Sent attempt: the server's final reply); 3. each recipient's outcome.
Errors:      50583 @MailID missing.  Transaction: reads only.  Isolation: sets READ COMMITTED.
Lock order:  none (three clustered index seeks on the mail's key).
Example:     EXEC mailq.GetMailHistory @MailID = 101;
*/
CREATE OR ALTER PROCEDURE mailq.GetMailHistory
    @MailID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF @MailID IS NULL
        THROW 50583, N'@MailID is required.', 1;
    SELECT
        q.ID,
        q.MessageID,
        q.AccountName,
        q.AppName,
        q.RunMode,
        q.Status,
        q.Priority,
        q.FromAddress,
        q.ToAddress,
        q.CC,
        q.BCC,
        q.Subject,
        q.dtStamp AS EnqueuedAtUtc,
        q.DateToProcess,
        q.VisibleAtUtc,
        q.SentAtUtc,
        q.DateProcessed,
        q.ExpiresAtUtc,
        q.AttemptCount,
        q.AttemptsRemaining,
        q.PossibleDuplicate,
        q.DryRun,
        q.LastError,
        q.TemplateName,
        q.TemplateVersion
    FROM mailq.MailQueue AS q
    WHERE q.ID = @MailID;
    SELECT
        t.AttemptNo,
        t.WorkerName,
        t.StartedAtUtc,
        t.EndedAtUtc,
        t.Outcome,
        t.SmtpCode,
        t.ErrorText,
        t.TemplateVersion
    FROM mailq.MailAttempt AS t
    WHERE t.MailID = @MailID
    ORDER BY t.AttemptNo;
    SELECT
        r.Address,
        r.Outcome,
        r.SmtpCode,
        r.SmtpText,
        r.AttemptNo,
        r.UpdatedAtUtc
    FROM mailq.MailRecipientOutcome AS r
    WHERE r.MailID = @MailID
    ORDER BY r.Address;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.FindMail: the mails a bulk action of `mailq-db dashboard` would touch, per account in
VisibleAtUtc order; reads only (one bounded seek on IX_MailQueue_Status).
Parameters:  @Status: UnSent, Failed, Cancelled, Expired or Stopped; @AccountName, @RunMode:
             NULL = all; @MaxRows INT 1-1000, default 100
Errors:      50581 @Status missing or not one of the five; 50582 @MaxRows out of range.
Transaction: reads only.  Isolation: sets READ COMMITTED.  Lock order: none.
Example:     EXEC mailq.FindMail @Status = N'Failed', @AccountName = N'default', @MaxRows = 500;
*/
CREATE OR ALTER PROCEDURE mailq.FindMail
    @Status NVARCHAR(16),
    @AccountName NVARCHAR(128) = NULL,
    @RunMode NVARCHAR(32) = NULL,
    @MaxRows INT = 100
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @MaxRows = COALESCE(@MaxRows, 100);
    IF @Status IS NULL OR @Status NOT IN (N'UnSent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
    BEGIN
        SET @Msg = CONCAT(
            N'@Status must be UnSent, Failed, Cancelled, Expired or Stopped; got ''', @Status, N'''.'
        );
        THROW 50581, @Msg, 1;
    END;
    IF @MaxRows NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@MaxRows must be 1-1000; got ', @MaxRows, N'.');
        THROW 50582, @Msg, 1;
    END;
    SELECT TOP (@MaxRows)
        q.ID,
        q.MessageID,
        q.AccountName,
        q.RunMode,
        q.Status,
        q.Subject,
        q.dtStamp AS EnqueuedAtUtc,
        q.DateProcessed,
        q.AttemptCount,
        q.LastError
    FROM mailq.MailQueue AS q WITH (INDEX (IX_MailQueue_Status), FORCESEEK)  -- a seek, never a scan
    WHERE
        q.Status = @Status
        AND (@AccountName IS NULL OR q.AccountName = @AccountName)
        AND (@RunMode IS NULL OR q.RunMode = @RunMode)
    ORDER BY q.AccountName, q.VisibleAtUtc, q.ID
    OPTION (RECOMPILE);
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Grants of role MailqMonitor: reads only (docs/monitoring/README.md).
*/
GRANT EXECUTE ON OBJECT::mailq.GetQueueMetrics TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.GetMailHistory TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.FindMail TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.GetMailEvents TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.GetQueueStats TO MailqMonitor;
GRANT EXECUTE ON OBJECT::mailq.GetSuppressionStats TO MailqMonitor;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Grants of role MailqAdmin on the monitoring procedures (the dashboard's actions).
*/
GRANT EXECUTE ON OBJECT::mailq.GetQueueMetrics TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetMailHistory TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.FindMail TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Role MailqDbMailRunner: the query runner of mailq.SendDbMail (mailq-db
dbmail-runner).  It also needs IMPERSONATE on each user that sends @query mail,
granted one by one (docs/database-mail.md, "How @query runs"):
GRANT IMPERSONATE ON USER::[report_user] TO MailqDbMailRunner;
*/
IF DATABASE_PRINCIPAL_ID(N'MailqDbMailRunner') IS NULL
    CREATE ROLE MailqDbMailRunner AUTHORIZATION dbo;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.ClaimDbMailQuery: leases one waiting mailq.SendDbMail query to a query runner: the oldest
Pending, or a Running one whose lease passed (its runner died: at-least-once).
Parameters:  @LockToken UNIQUEIDENTIFIER, required; @LeaseSeconds INT 10-3600, default 300
Result set:  zero or one row: MailItemID, MailID, Query, Database, RequestUser, RequestUserSid
             (whom to impersonate, and the SID to find), the sp_send_dbmail query options, Attempts.
Errors:      50660 @LockToken missing or @LeaseSeconds not 10-3600.
Transaction: one statement.  Isolation: sets READ COMMITTED.  Lock order: mailq.DbMailItem only.
Example:     EXEC mailq.ClaimDbMailQuery @LockToken = @T, @LeaseSeconds = 300;
*/
CREATE OR ALTER PROCEDURE mailq.ClaimDbMailQuery
    @LockToken UNIQUEIDENTIFIER,
    @LeaseSeconds INT = 300
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF @LockToken IS NULL OR COALESCE(@LeaseSeconds, 0) NOT BETWEEN 10 AND 3600
        THROW 50660, N'@LockToken is required and @LeaseSeconds must be 10-3600.', 1;
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    WITH NextQuery AS (
        SELECT TOP (1)
            i.MailItemID, i.MailID, i.Query, i.ExecuteQueryDatabase, i.RequestUser, i.RequestUserSid,
            i.AttachQueryResultAsFile, i.QueryAttachmentFilename, i.QueryResultHeader, i.QueryResultWidth,
            i.QueryResultSeparator, i.ExcludeQueryOutput, i.AppendQueryError, i.QueryNoTruncate,
            i.QueryResultNoPadding, i.QueryResultFormat, i.QueryState, i.QueryDueAtUtc, i.QueryLockToken,
            i.QueryAttempts
        FROM mailq.DbMailItem AS i WITH (READPAST, UPDLOCK, ROWLOCK)
        -- READPAST, UPDLOCK, ROWLOCK: claim while reading, skipping others' rows.
        WHERE i.QueryState IN (N'Pending', N'Running') AND i.QueryDueAtUtc <= @Now
        ORDER BY i.QueryDueAtUtc, i.MailItemID
    )

    UPDATE NextQuery
    SET
        QueryState = N'Running',
        QueryLockToken = @LockToken,
        QueryDueAtUtc = DATEADD(SECOND, @LeaseSeconds, @Now),
        QueryAttempts = QueryAttempts + 1
    OUTPUT
        inserted.MailItemID, inserted.MailID, inserted.Query, inserted.ExecuteQueryDatabase AS [Database],
        inserted.RequestUser, inserted.RequestUserSid, inserted.AttachQueryResultAsFile,
        inserted.QueryAttachmentFilename, inserted.QueryResultHeader, inserted.QueryResultWidth,
        inserted.QueryResultSeparator, inserted.ExcludeQueryOutput, inserted.AppendQueryError,
        inserted.QueryNoTruncate, inserted.QueryResultNoPadding, inserted.QueryResultFormat,
        inserted.QueryAttempts AS Attempts;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.CompleteDbMailQuery: a runner hands back its query: 'Done' joins the result to the mail (after
CRLF in the body, or attached) and makes it due; 'Failed' or an oversized result stops it (StopMail's row).
Parameters:  @MailItemID INT, @LockToken (the claim's), @Outcome 'Done' | 'Failed'; Done: @Text
             (body) or @Attachment, @FileName, @ContentType; Failed: @Error
Errors:      50661 the claim is lost (finished or taken over); 50662 @Outcome or its arguments.
Transaction: its own if none is open, else the caller's; an error dooms it.  Isolation: READ COMMITTED.
Lock order:  mailq.MailQueue, mailq.MailAttachment (or StopMail's), then mailq.DbMailItem.
Example:     EXEC mailq.CompleteDbMailQuery @MailItemID = 7, @LockToken = @T, @Outcome = 'Done', @Text = N'...';
*/
CREATE OR ALTER PROCEDURE mailq.CompleteDbMailQuery
    @MailItemID INT,
    @LockToken UNIQUEIDENTIFIER,
    @Outcome VARCHAR(6),
    @Text NVARCHAR(MAX) = NULL,
    @Attachment VARBINARY(MAX) = NULL,
    @FileName NVARCHAR(255) = NULL,
    @ContentType NVARCHAR(255) = NULL,
    @Error NVARCHAR(4000) = NULL
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Hold DATETIME2(3) = '9000-01-01T00:00:00';
    DECLARE @Now DATETIME2(3) = SYSUTCDATETIME();
    DECLARE @CrLf NCHAR(2) = NCHAR(13) + NCHAR(10);
    DECLARE @Lost NVARCHAR(200)
        = N'The query runner''s claim on this item is lost (finished, or taken over after its lease).';
    IF @Outcome NOT IN ('Done', 'Failed')
        OR (@Outcome = 'Failed' AND NULLIF(@Error, N'') IS NULL)
        OR (@Outcome = 'Done' AND @Attachment IS NULL AND @Text IS NULL)
        OR (@Outcome = 'Done' AND @Attachment IS NOT NULL AND @Text IS NOT NULL)
        OR (@Attachment IS NOT NULL AND NULLIF(@FileName, N'') IS NULL)
        THROW 50662, N'@Outcome must be Done (with @Text, or @Attachment and @FileName) or Failed (with @Error).', 1;
    DECLARE @MailID BIGINT = (
        SELECT i.MailID
        FROM mailq.DbMailItem AS i
        WHERE i.MailItemID = @MailItemID AND i.QueryState = N'Running' AND i.QueryLockToken = @LockToken
    );
    IF @MailID IS NULL
        THROW 50661, @Lost, 1;
    IF @Outcome = 'Done' AND (
        LEN(@Text) + (SELECT LEN(q.Body) FROM mailq.MailQueue AS q WHERE q.ID = @MailID) + 2 > 2000000
        OR DATALENGTH(@Attachment) > 10485760
    )
        SELECT
            @Outcome = 'Failed',
            @Error = N'the result is over the queue''s limits (2,000,000 characters in the body, 10 MiB attached).';
    DECLARE @OwnTran BIT = IIF(@@TRANCOUNT = 0, 1, 0);
    BEGIN TRY
        IF @OwnTran = 1 BEGIN TRANSACTION;
        IF @Outcome = 'Done'
        BEGIN
            UPDATE q
            SET
                q.Body = IIF(@Text IS NULL, q.Body, CONCAT(q.Body, @CrLf, @Text)),
                q.DateToProcess = @Now,
                q.VisibleAtUtc = @Now
            FROM mailq.MailQueue AS q WITH (UPDLOCK, ROWLOCK)
            WHERE q.ID = @MailID AND q.Status = N'UnSent' AND q.VisibleAtUtc = @Hold;
            IF @@ROWCOUNT = 1 AND @Attachment IS NOT NULL
                INSERT INTO mailq.MailAttachment (MailID, AttachmentNo, FileName, ContentType, Content)
                VALUES (@MailID, 1, @FileName, COALESCE(@ContentType, N'text/plain'), @Attachment);
        END;
        ELSE IF EXISTS (
            SELECT 1 FROM mailq.MailQueue AS q WHERE q.ID = @MailID AND q.Status IN (N'UnSent', N'Sending')
        )
        BEGIN
            DECLARE @Reason NVARCHAR(4000) = LEFT(CONCAT(N'Query execution failed: ', @Error), 4000);
            EXEC mailq.StopMail @MailID = @MailID, @Reason = @Reason;
        END;
        UPDATE mailq.DbMailItem
        SET
            QueryState = IIF(@Outcome = 'Done', N'Done', N'Failed'),
            QueryLockToken = NULL,
            QueryDueAtUtc = NULL,
            QueryError = IIF(@Outcome = 'Done', NULL, LEFT(@Error, 4000)),
            QueryFinishedAtUtc = @Now
        WHERE MailItemID = @MailItemID AND QueryState = N'Running' AND QueryLockToken = @LockToken;
        IF @@ROWCOUNT = 0
            THROW 50661, @Lost, 1;
        IF @OwnTran = 1 COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @OwnTran = 1 AND XACT_STATE() <> 0 ROLLBACK TRANSACTION;
        THROW;
    END CATCH;
END;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_mailattachments: msdb.dbo.sysmail_mailattachments over the queue:
a SendDbMail query's result file, msdb's columns in msdb's order; attachment_id
BIGINT = MailItemID * 10 + number - 1; rows as mailq.sysmail_allitems
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-mailattachments-transact-sql).
*/
CREATE OR ALTER VIEW mailq.sysmail_mailattachments
AS
SELECT
    CAST(i.MailItemID AS BIGINT) * 10 + a.AttachmentNo - 1 AS attachment_id,
    i.MailItemID AS mailitem_id,
    CAST(a.FileName AS NVARCHAR(260)) AS filename,
    CAST(DATALENGTH(a.Content) AS INT) AS filesize,
    a.Content AS attachment,
    i.SendRequestDate AS last_mod_date,
    CAST(i.SendRequestUser AS SYSNAME) AS last_mod_user
FROM mailq.DbMailItem AS i
INNER JOIN mailq.MailAttachment AS a ON i.MailID = a.MailID
WHERE
    IS_MEMBER(N'db_owner') = 1
    OR IS_MEMBER(N'MailqAdmin') = 1
    OR i.SendRequestUser = COALESCE(SUSER_SNAME(), USER_NAME());
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_profile: msdb.dbo.sysmail_profile's columns over mailq.DbMailProfile
(last_mod_datetime: the creation time, local; last_mod_user NULL).
*/
CREATE OR ALTER VIEW mailq.sysmail_profile
AS
SELECT
    p.ProfileID AS profile_id,
    CAST(p.ProfileName AS SYSNAME) AS name,
    CAST(p.Description AS NVARCHAR(256)) AS description,
    CAST(DATEADD(MINUTE, DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()), p.CreatedAtUtc) AS DATETIME)
    AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user
FROM mailq.DbMailProfile AS p;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_account: msdb.dbo.sysmail_account's columns over the sending accounts
in a profile: email_address and display_name are the account's defaults;
description and replyto_address NULL.  SMTP settings live in the worker's config.
*/
CREATE OR ALTER VIEW mailq.sysmail_account
AS
SELECT
    da.AccountID AS account_id,
    CAST(a.AccountName AS SYSNAME) AS name,
    CAST(NULL AS NVARCHAR(256)) AS description,
    a.DefaultFromAddress AS email_address,
    a.DefaultFromName AS display_name,
    CAST(NULL AS NVARCHAR(128)) AS replyto_address,
    CAST(DATEADD(MINUTE, DATEDIFF(MINUTE, SYSUTCDATETIME(), SYSDATETIME()), a.CreatedAtUtc) AS DATETIME)
    AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user
FROM mailq.DbMailAccount AS da
INNER JOIN mailq.SendingAccount AS a ON da.AccountName = a.AccountName;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_profileaccount: msdb.dbo.sysmail_profileaccount's columns over
mailq.DbMailProfileAccount (the failover order of a profile's accounts).
*/
CREATE OR ALTER VIEW mailq.sysmail_profileaccount
AS
SELECT
    pa.ProfileID AS profile_id,
    pa.AccountID AS account_id,
    pa.SequenceNumber AS sequence_number,
    CAST(NULL AS DATETIME) AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user
FROM mailq.DbMailProfileAccount AS pa;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_principalprofile: msdb.dbo.sysmail_principalprofile's columns over
mailq.DbMailPrincipalProfile; principal_sid 0x00 for public, NULL for a principal
gone; principal_name added last.
*/
CREATE OR ALTER VIEW mailq.sysmail_principalprofile
AS
SELECT
    pp.ProfileID AS profile_id,
    CAST(IIF(pp.PrincipalName = N'public', 0x00, dp.sid) AS VARBINARY(85)) AS principal_sid,
    pp.IsDefault AS is_default,
    CAST(NULL AS DATETIME) AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user,
    CAST(pp.PrincipalName AS SYSNAME) AS principal_name
FROM mailq.DbMailPrincipalProfile AS pp
LEFT JOIN sys.database_principals AS dp ON pp.PrincipalName = dp.name;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
mailq.sysmail_configuration: msdb.dbo.sysmail_configuration's columns with this
package's fixed values (docs/database-mail.md, "Settings"): MaxFileSize,
ProhibitedExtensions (14630), AccountRetryAttempts (attempts per mail), LoggingLevel 2.
*/
CREATE OR ALTER VIEW mailq.sysmail_configuration
AS
SELECT
    c.paramname,
    c.paramvalue,
    c.description,
    CAST(NULL AS DATETIME) AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user
FROM (
    VALUES
    (
        CAST(N'AccountRetryAttempts' AS NVARCHAR(256)), CAST(N'5' AS NVARCHAR(256)),
        CAST(N'Attempts per mail (all accounts together), then the mail fails' AS NVARCHAR(256))
    ),
    (N'LoggingLevel', N'2', N'sysmail_event_log: errors, warnings, successes and information'),
    (N'MaxFileSize', N'10485760', N'Bytes per attachment (the queue''s limit)'),
    (N'ProhibitedExtensions', N'exe,dll,vbs,js', N'Refused for @query_attachment_filename (14630)')
) AS c(paramname, paramvalue, description);
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Grants of role MailqDbMailRunner: claim a waiting query, hand back its result.
*/
GRANT EXECUTE ON OBJECT::mailq.ClaimDbMailQuery TO MailqDbMailRunner;
GRANT EXECUTE ON OBJECT::mailq.CompleteDbMailQuery TO MailqDbMailRunner;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
Grants of role MailqAdmin on the Database Mail catalogue and attachments views.
*/
GRANT SELECT ON OBJECT::mailq.sysmail_mailattachments TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_profile TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_account TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_profileaccount TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_principalprofile TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.sysmail_configuration TO MailqAdmin;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
/*
MailqDbMailUser on the attachments view (as msdb; own mail only); its own file:
the view is created after MailqDbMailUser.grants.sql.
*/
GRANT SELECT ON OBJECT::mailq.sysmail_mailattachments TO MailqDbMailUser;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
DECLARE @Files TABLE (Revision VARCHAR(32) NOT NULL, FilePath NVARCHAR(400) NOT NULL, Sha256 CHAR(64) NOT NULL);
INSERT INTO @Files (Revision, FilePath, Sha256) VALUES
    ('0001', N'checks/mailq.CheckServer.sql', '85bb3bfcb546f2a9ceebb51fca5d6089839c463b4d1c28c139cb2631fbce4ce9'),
    ('0001', N'schemas/mailq.sql', '0b58994cbbdb350c1c3d6bea22e6acc7eac3044b62542bb8e4adc234ff7daabe'),
    ('0001', N'security/MailqEnqueuer.role.sql', '9031160ef70a98368f463b9621b8d87df82403cd7d7ccfdb82cae307b51a545b'),
    ('0001', N'security/MailqSender.role.sql', 'e0a7c74b9cdc5c75df3092465654a1c213c74f78d9fc18cd66dc445fbcdbbe92'),
    ('0001', N'security/MailqAdmin.role.sql', '55ea3f458b3be212241b82c86330d3e77dd424f6e371c15b51934a5a2ac5912a'),
    ('0001', N'security/MailqDelayCaller.role.sql', '3b317bf8b478021cbfde763baa0529e0f69bce22cc5507db5ba97970fc22aa98'),
    ('0001', N'security/MailqRunner.user.sql', '6f1e525fd09bd2b567ef232d5d7a7b541079e86ee6b5ede711566927782ee946'),
    ('0001', N'tables/mailq.SendingAccount.sql', '2f835735e92d1a1cd29900f0a180da74aa944eb6b3b15946123e41968e84ac92'),
    ('0001', N'tables/mailq.RateBudget.sql', 'fc1f4885d6e8ad3073efa81978c90128956c03fa4ba379674a6ffcf48f2a1844'),
    ('0001', N'tables/mailq.Application.sql', 'ce2520366efe18553a1106ff3f32f0c671f9af6b1b2b2e7ff63ab0a32d7e8b74'),
    ('0001', N'tables/mailq.MailQueue.sql', '23176826b71aa13fddffe44b85230bd81f0041daadc20a86b170b2dbdd40802a'),
    ('0001', N'tables/mailq.MailAttachment.sql', '647f14772652007856e97ae7dbac6eb6c88c744265d0785921e9a7cd8ae9eca5'),
    ('0001', N'tables/mailq.MailAttempt.sql', '77a5489c77fbb21374ef3b1af781c602377ee0a52150822be04771541aad5a9c'),
    ('0001', N'tables/mailq.ApplicationAccount.sql', '52cc59079a18055cbe463dbc8da9a6da00399725cd24498a86e04439e5c53743'),
    ('0001', N'tables/mailq.ApplicationFrom.sql', '7fbc1e901c787d47b2645d3d7050b0cb411571106e643fa39c489b44aa35875f'),
    ('0001', N'tables/mailq.ApplicationPrincipal.sql', '615479cc4df329728da06a60b0db72a35184a830cd864f30f31c77aa78a5bb45'),
    ('0001', N'tables/mailq.EnqueuePolicy.sql', 'f2933e0023c17e7806eb571d2b5b6626db6660477ff17d3786fcaa051084c09a'),
    ('0001', N'indexes/mailq.MailQueue.IX_MailQueue_ClaimByAccount.sql', '8df5492e2302b09bd4df2e4d8201a3f2d88380bb0a537e017640f142ee4cf4f7'),
    ('0001', N'indexes/mailq.MailQueue.IX_MailQueue_Finalize.sql', '019854d40c0d04543a74eddf6dcc8794f99aefaee5d0c7a20325be40b8c0f646'),
    ('0001', N'indexes/mailq.MailQueue.IX_MailQueue_Expiry.sql', 'd50d7f60ff0b43da4636706632406270406a7e2b6b6b87feb9e254c1573d4442'),
    ('0001', N'tables/mailq.MailRecipientOutcome.sql', '3dd3c4921f18d224f0a8faab4a2300308727a6fd394923b89a6d6d384485bb30'),
    ('0001', N'indexes/mailq.MailQueue.UX_MailQueue_IdempotencyKey.sql', '7b923369fc8a49f7ef6198c06ec89d8e21c859ef5fcf7761fe0819189243f3b8'),
    ('0001', N'indexes/mailq.MailQueue.IX_MailQueue_Final.sql', '511867a54b0e49434c6d5b85cbcabae57c81fe737add4f46b27eb2ec71650483'),
    ('0001', N'indexes/mailq.MailAttempt.IX_MailAttempt_EndedAtUtc.sql', '2c124eaf37581473cebe8238f66585ceb2ab40c7811a1a5a1095fabfb8e39f6f'),
    ('0001', N'indexes/mailq.SendingAccount.UX_SendingAccount_IsDefault.sql', '0eef60e5764aa205e755b7d5dbcb1c4eb4d61ee6446f0a18a32033c878bf7833'),
    ('0001', N'indexes/mailq.MailQueue.IX_MailQueue_Status.sql', '878c56a2fbf4415c85b71cac648c1eed46dbd4c1f073c2c2120880a254666ee3'),
    ('0001', N'tables/mailq.MailEvent.sql', '1d09f74345fcbc97f3c8a0d349f7809bce395448a0110ed2bb2e6f8a2317df82'),
    ('0001', N'indexes/mailq.MailEvent.IX_MailEvent_AppName.sql', '5b86cfe09982ec49227c9378c67f41bc6df9d239d6e281950015252bc12e0fcf'),
    ('0001', N'indexes/mailq.MailEvent.IX_MailEvent_MailID.sql', '5eb66fb09a014a123774f78c01d118a00deecb0da1b052dc40d54bc3f7d9729b'),
    ('0001', N'tables/mailq.ApplicationHook.sql', 'fe4e1fcb64689b4f21d99352bd404e6396e52902b1d2767786808bf82233deca'),
    ('0001', N'tables/mailq.ApplicationHookFailure.sql', 'a2cb28d982f33f50409ffa89ba53f1b53e79ca75bb85d5c3ff67f9b57e06532b'),
    ('0001', N'indexes/mailq.MailQueue.IX_MailQueue_ClaimByApp.sql', '93de76085ce6d6e6abda18eafae2507892f8b4062c399740e65c562b08443009'),
    ('0001', N'functions/mailq.ParseAddressList.sql', '3da5f904215c4a5b15839c60bd3a22d21bf16ba7dffbf488f2b6a5f6f8731a3e'),
    ('0001', N'functions/mailq.ParseIDList.sql', 'da3ed12c0de9d038e1bdc919b1885f4d8930fdfad7d887c1cbc81fe21868656a'),
    ('0001', N'functions/mailq.HookPin.sql', '14478ec51277456a006c967ef570511905fa1a6bbd4940215576071cecb1ac14'),
    ('0001', N'tables/mailq.Suppression.sql', 'da9e2ba03a9d52ecbd98a8c7d3c4c8663428bdea4df27ce0e26af3194aee24d7'),
    ('0001', N'tables/mailq.SuppressionHistory.sql', '6efb2e5781c9679a40f6cd149e97f6e2f66e0095158db20d38e43684f5285782'),
    ('0001', N'tables/mailq.BounceReport.sql', '3c847cd36edbb54e07beaa0348cab68ff64a7c84d542e54dfab19d9ec216d210'),
    ('0001', N'indexes/mailq.BounceReport.IX_BounceReport_Address.sql', '1d006a9ab08f86c6b7e841955520be45a8e62115c16dab1bef7f9509b0975b76'),
    ('0001', N'indexes/mailq.BounceReport.IX_BounceReport_ReceivedAtUtc.sql', '0bbe3c46ba7311580cb4a1a1a2129dcabf614c563a3a71846574b3931ab54175'),
    ('0001', N'functions/mailq.MailRecipientList.sql', '9d3c6d4660576d3a99dd6709014ceef4451f553f069772a306312c047909f9c8'),
    ('0001', N'functions/mailq.FilterSuppressedRecipients.sql', '73545d8b3e42a8010f48db622d3365e2c26e9e3032d722b878008ebf466eee9a'),
    ('0001', N'types/mailq.MailBatchRow.sql', '399a3cfeb7550861e3f26ae4417d9c60148dfaeee635ff4b42b14114b3a090ec'),
    ('0001', N'functions/mailq.MailAttachmentList.sql', '0b2e76759062fb352403793dd2b045d1349086e49f6381b672221ffeef4ea487'),
    ('0001', N'functions/mailq.MailBatchJson.sql', '1fdd1d16365b0245f8304957b71f3ababdbcb325679caa0f3c44093d8b4ca59e'),
    ('0001', N'functions/mailq.EnqueueMailCheck.sql', '13a844ec80f1aa8f927dfcfa7037526845c13edd6e8a34013ca22f2b68011059'),
    ('0001', N'views/mailq.QueueCountsByStatus.sql', 'ab8d9b6234fb2edc50cd0d9cd88370092e0f5cea9aa5f0fe941f784e88a555c1'),
    ('0001', N'views/mailq.OldestDueMail.sql', 'c1e8c7bbb648e866f00e2ec6d14aa17b548e6bb434ea549344f731251b59e486'),
    ('0001', N'views/mailq.ThroughputPerHour.sql', '3ecd65d5fabf3581706cdc62af282729ff94103e16b186c0b0da1b07738491cd'),
    ('0001', N'views/mailq.RecentFailures.sql', '884ce76e279e329c7cfe1c2adebcb743509b3e9da83c9bc169f75c095287d3b9'),
    ('0001', N'views/mailq.RecipientOutcomes.sql', '931f6a4311bc05874ccaeca4480859f894a66fefa0ddddefe0353844a80d521c'),
    ('0001', N'procedures/mailq.LockLeasedMail.sql', '57e7a8bcff5696aad849a5f2f9986dc0eb7073c0022b6fe88a4b10d6fd685177'),
    ('0001', N'procedures/mailq.EnqueueMailRows.sql', '1d79ca00f8cd6821f2d8518e3115840bbf2c69d3dd4d858f7b2921d8350c5b4a'),
    ('0001', N'procedures/mailq.EnqueueMail.sql', 'd69ca714e0a7703615d3ec2eabb3981738950c080a588cff31b32b18d3be6bbf'),
    ('0001', N'procedures/mailq.EnqueueMailBatch.sql', 'd0d527428f3becb3728ca661ec67d74213fd7fbdb79c39a841f4c0b0bade7685'),
    ('0001', N'procedures/mailq.CheckClaimRequest.sql', '14051f562c2f97afdf08ced3db10d68bc21db9a18bfd186b31977fcedbda7be5'),
    ('0001', N'procedures/mailq.ClaimMail.sql', '4fab519a55238a320ac6d1e1f108d1b6b452920f02868f964a31c7dc65392d26'),
    ('0001', N'procedures/mailq.FinalizeMail.sql', '8fc7bbd5019a55a67641a3ccf028473b2cde1188b92cf62d3353195aa00cd6a4'),
    ('0001', N'procedures/mailq.ExtendLease.sql', 'a7e8771b9a660135a3c2f6ce00e23a726ced7b27f8f48c1e39ed3baa14bef449'),
    ('0001', N'procedures/mailq.ReleaseMail.sql', 'd86f025705bdad4d705a279820f28445036fa59aa2697e8bd5fc2998a338a302'),
    ('0001', N'procedures/mailq.MarkSent.sql', 'e61a668a1aa8125249139e79f6586ab3aaa81e705046046976313c2ddc21d196'),
    ('0001', N'procedures/mailq.MarkFailed.sql', '758245b5786bca9dd80804123425e0104d3bff3fd9ef05c2537345c28c88b23d'),
    ('0001', N'procedures/mailq.CancelMail.sql', '2fa057f44551e94b059da43c82f50c28dc392bd07350f68f80062435d1734f9c'),
    ('0001', N'procedures/mailq.RequeueMail.sql', '1796a14cce9e92478723775fcc3b07e2986f701fccaf60549a8534153d25bd44'),
    ('0001', N'procedures/mailq.PurgeMail.sql', '0b6426f8a27d83ab66a85f2d30f538c166dfa49e90a4abbdafbaf5005cadb16d'),
    ('0001', N'procedures/mailq.UpsertSendingAccount.sql', '73913888ba3539644b3acda7237ab6f0208a764917a4ccea606570c84bf6c379'),
    ('0001', N'procedures/mailq.UnblockSendingAccount.sql', 'b52cd4f9fecd8a4fb17246ab1585a69c61fa193b4166cb92eefeb5d0d44b9807'),
    ('0001', N'procedures/mailq.AcquireLoginSlot.sql', '103d0cec56e2060e58cfbcdf448024dca179b6924b97027b6bc525aedea4b50f'),
    ('0001', N'procedures/mailq.UpsertApplication.sql', '74746f883547637693d3b0fb7cac6456e9353c71bfda7242eed661b3cfdbb361'),
    ('0001', N'procedures/mailq.BindApplication.sql', '70f8dc39bc05404b3b46479e3213ae0e2377ee985a447217635edaffbbe7f2d5'),
    ('0001', N'procedures/mailq.UnbindApplication.sql', 'e5b43ac81c58b8c83befaf52985677c6cb350c84313350a6b7f2292e215d48f0'),
    ('0001', N'procedures/mailq.SetEnqueuePolicy.sql', 'd3ccf3e0f7fe60e0617718be6a0494995835c60f1d8e5c934bccc6e2540a848b'),
    ('0001', N'procedures/mailq.GetEnqueuePolicy.sql', '0cfa2dc58211aebfa7391596c5519984aba40ca1c040902314f5e05a389923f3'),
    ('0001', N'procedures/mailq.GetQueueStats.sql', 'ca4bb0e160c19a4ea2e3dc4ccd4ff8f38fcd728975e2cf99cd315e3715e3641c'),
    ('0001', N'procedures/mailq.GetInstallationHealth.sql', '1fff4b445f9edb7d0309644f75dac40a1ccda5a81af7839be2d6b30eda05265f'),
    ('0001', N'procedures/mailq.RecordRecipientOutcomes.sql', 'b3e7e295140439f926f62df711d19c3ea57df0e12f42d240091ab0b1126c3d7a'),
    ('0001', N'procedures/mailq.GetRecipientOutcomes.sql', '020ef5ba4621ae60bfeef1aeca5dcb58b8db8c31256f6c2eb5a02b9c3c0e5b85'),
    ('0001', N'procedures/mailq.GetMailEvents.sql', '756b86ad8cf49ffd85a5e57c78aedba7b5b23696db998cdfa1585cb4454a3b2a'),
    ('0001', N'procedures/mailq.StopMail.sql', '3815f126d0608f2109939c5869bc0ecbd2bb65aa2f5f4126b19f367163d631af'),
    ('0001', N'procedures/mailq.SetApplicationHook.sql', '9757275ec8d22fe25cba7919cd49e3cd62f3117f2fbe0ed0d3669c17cdb3dff7'),
    ('0001', N'procedures/mailq.RunApplicationHooks.sql', '3c06848967b46e6c5d5302d0591e23656dd0a034f5d9c8a8b938985a82d83977'),
    ('0001', N'procedures/mailq.ListApplicationHooks.sql', '6c1cf7a4a8574f655f015b5759d0b649908a8aa9411d9cbab3bef222adaeb470'),
    ('0001', N'procedures/mailq.GetEventStreamStall.sql', 'd19f9025524a9e681080f8e5864ed4df270944ee5739d93a0b38977b99e87285'),
    ('0001', N'security/MailqEnqueuer.grants.sql', 'a63718c6a392c87e93165ff3ff1af09be103805eb73ba6fdcdf1db95ad27b502'),
    ('0001', N'security/MailqEnqueuer.batch.grants.sql', '0c94875cda8ed0c299fab6bf37c37f2a01e8bfaba8d80510196b4e9dd4903ff1'),
    ('0001', N'security/MailqSender.grants.sql', '400110d3b8a4d6b3e3e4da002ad0204e6e8fbc02f65a17a550cd7c1e1343d0fb'),
    ('0001', N'security/MailqAdmin.grants.sql', '0a103aaa193da90af787929f45c1c9d67d836332aea8f38c0ea033cd7d6bdc9f'),
    ('0001', N'security/MailqSender.finalize.grants.sql', '303630d04fb9393e431df39d16b7575df7b90275e3926b768f4f01ae0f8a5977'),
    ('0001', N'security/MailqSender.recipients.grants.sql', '145e79bf60fc43287c82925110f0cd0305cbf5a6526d1718c829f5a9a11b4a7c'),
    ('0001', N'security/MailqAdmin.hooks.grants.sql', '3555266edd4136eae0879986d33994a228793100d9f0db2d86765a35401fbc8e'),
    ('0001', N'security/MailqAdmin.enqueue.grants.sql', '48c7304d321ada409eae0ba80ac68f11257c0bc0779d45665d9f05548ea86b99'),
    ('0001', N'security/MailqEnqueuer.eventstall.grants.sql', '9c4ccd0dc2369d046d02f5eca26cdc917f119c3719640dcc048ae3fac8a4e513'),
    ('0001', N'tables/mailq.MailTemplate.sql', 'a49eee6464b5484e049c1ecf0011afb386acbe5ddab067be252d67e911d6f46d'),
    ('0001', N'tables/mailq.MailTemplateVersion.sql', 'a2d6f5a8d6ea14c67e166981b2334360fff66aac1d27a295e0889aac4c6b6826'),
    ('0001', N'tables/mailq.MailTemplateVersion.trg_MailTemplateVersion_Immutable.sql', 'a88c3e9c31c02ddcca2437b343b015c0c739f4368cbebbd9889671ee88329e62'),
    ('0001', N'procedures/mailq.AddMailTemplateVersion.sql', '82695f413b2fabd33bb7e45bfb3c65ab7d851d2985737b4bbf782fd6001c1931'),
    ('0001', N'procedures/mailq.GetMailTemplate.sql', '6c7835174187c391c9c7b40b1ead6cbe84635839946eb68fec52164d4e2c1a26'),
    ('0001', N'procedures/mailq.ListMailTemplates.sql', 'e037fb1ffa7ced91d54e72b1f73493c381079f8dd2d46ebd9d6ee44cabf54aff'),
    ('0001', N'procedures/mailq.ListMailTemplateVersions.sql', '45977a3b95dc5314425422bb6c5ad11f61b63daf8be72b7c16b7249cdfe3f19f'),
    ('0001', N'procedures/mailq.RetireMailTemplate.sql', '844660df48e8911a273bbb935b5e2a3fe4bf8d174f0a0c85af7cb9f0073fd8f7'),
    ('0001', N'security/MailqAdmin.templates.grants.sql', '8165b34579cf1291096f779e11a5c1637f6e144bf04aa10d5e4ee4d46aa22e9d'),
    ('0001', N'security/MailqDbMailUser.role.sql', 'dfd271f8eb83f683f2db2d358e9154df4466ffa1564eb53badebe760621f4f74'),
    ('0001', N'tables/mailq.DbMailProfile.sql', '28af54b04662bf10b9f3f4fad536c391fa79b6d5921c5542a2d0c1120ac766ff'),
    ('0001', N'tables/mailq.DbMailAccount.sql', 'b2a98f4cf53f89b1662b68d47550f5d5434975db1ffb6f7423544a0b556e5235'),
    ('0001', N'tables/mailq.DbMailProfileAccount.sql', '1e676b7aab638d8179958729419515a8e0186a3e9f8550f885c9588225012a34'),
    ('0001', N'tables/mailq.DbMailPrincipalProfile.sql', 'a83d2a8b964808405ce1efcd4c0b9df75e9018a1bd13c0ab3c5431b2d2bc7a3f'),
    ('0001', N'tables/mailq.DbMailItem.sql', 'a384ef975df9321c87623dc661fe15707e771cc7677b6b82f219940ea6bb3231'),
    ('0001', N'indexes/mailq.DbMailItem.IX_DbMailItem_SendRequestDate.sql', '66c9fcf22ee8bf2ea70ed9689d00ca342bab653388dd6ce37b4d61e6eb2304b7'),
    ('0001', N'indexes/mailq.DbMailItem.IX_DbMailItem_QueryDue.sql', '486696a89eda6e29fc251442b1b6dd2c4cd32842470552d3b16cfed5999fc4b8'),
    ('0001', N'indexes/mailq.DbMailPrincipalProfile.UX_DbMailPrincipalProfile_Default.sql', '37ce93b9af2cf79e1d0082db355c083051c279536cea946b18c0ccc8351bff74'),
    ('0001', N'views/mailq.sysmail_allitems.sql', '91f0f291dd55a388a24d403fb478d76ee26af9fd16a23ec297a41b993f3a450e'),
    ('0001', N'views/mailq.sysmail_sentitems.sql', 'de4fa39e15acdb1a888ed218a382287d61d978b843b21b6e2b90063dd02b3688'),
    ('0001', N'views/mailq.sysmail_unsentitems.sql', '5dd86add632ec45411e63df40dbce2c0f23e720f9f0e901c01b7f62581885839'),
    ('0001', N'views/mailq.sysmail_faileditems.sql', '57b8cb0c3ca808f8b4cda5c2c9db34738f837e28ba2229124e77fe5b2b6f0dbf'),
    ('0001', N'views/mailq.sysmail_event_log.sql', '047d4f5c1c80d7a8de5d1799d2e4a0502375de89cbe374d968146f5b1e0f9a7c'),
    ('0001', N'functions/mailq.DbMailAddressProblem.sql', 'c1a0525c0b9bdb7f7295807871e76e3605fd4b8942b5a2621590b2ee635bd28f'),
    ('0001', N'procedures/mailq.CheckDbMailRequest.sql', 'e1d7fbc24acffe6ed0583b6f00ff1e530623785b6ad7d5bba6283bc8080dba98'),
    ('0001', N'procedures/mailq.SendDbMail.sql', 'c4b8232d734bfecaf7b8890953c2044c101ecfa2951b2b285444972faccc47e6'),
    ('0001', N'procedures/mailq.UpsertDbMailProfile.sql', '40dd1665ce78bf4a6d74a3d1f818c41cd9d3b8fd2e1e6a2acca76d18951073de'),
    ('0001', N'procedures/mailq.DeleteDbMailProfile.sql', '562592766f959be178e8e6f6ff53bae6e2ba36879ee88eec53aa3c2604662f9e'),
    ('0001', N'procedures/mailq.UpsertDbMailProfileAccount.sql', '6a90f279e07e8508fff9f831c2f5491cff9cda5ad38c4b9032b89cb35cc896d1'),
    ('0001', N'procedures/mailq.DeleteDbMailProfileAccount.sql', 'b31406a83961638b2bac8e1aa8174e0807b9b25aca64c102b2626ec85e3bab35'),
    ('0001', N'procedures/mailq.UpsertDbMailPrincipalProfile.sql', 'e85ecc70ba72134c517caff61a1112efa4cd5d58026dd02e3bb63ff9f822251f'),
    ('0001', N'procedures/mailq.DeleteDbMailPrincipalProfile.sql', '200b1a115832dd8af5f0c3f989f6e9ffeea8d02b3e5f75e187dd57ba0d12ec01'),
    ('0001', N'security/MailqDbMailUser.grants.sql', 'a90b7cec3fb015c990fedf64d206e462e6c68072a28890665619e1812bb0b7e7'),
    ('0001', N'security/MailqAdmin.dbmail.grants.sql', '5bc45dc16e882cb8c1baa4281dd06efb750fd64f6ce7aecedf41a14221db77d5'),
    ('0001', N'security/MailqBounceReader.role.sql', '5a85dbbd3a7336a5982c6c24fe1c6487632c6410261401aadac0614ef4e20eaa'),
    ('0001', N'functions/mailq.SuppressionsAsOf.sql', '30d44a9e04079685695ede370d91bbdb50995b3c111a4a130151febb527c5e39'),
    ('0001', N'views/mailq.Suppressions.sql', '592f769ca88a97a3fd9ad1e1eafbc7df5245f2f9b7be6f32114eb403f32c8fc4'),
    ('0001', N'views/mailq.RecentBounceReports.sql', 'fed5cdae95664e0f44799da08f8674094aa16c5f819efa79115661152d6469ae'),
    ('0001', N'procedures/mailq.ApplySuppressions.sql', '74d9daf3292ed5bc1ab1ea1bfa36cf671199e545c490ae63f8d9fb5c53fb7196'),
    ('0001', N'procedures/mailq.CheckBounceReport.sql', 'bedc1a7c370dd7cb0858d218d95ba59c54f631bce414adbcf9f9f1b368be9ea6'),
    ('0001', N'procedures/mailq.RecordBounce.sql', '736d71cdace9c3c3804dc4d3b0ae4d57a9db400f6ebbcf17c60f72552e506d0f'),
    ('0001', N'procedures/mailq.RecordUnsubscribe.sql', 'bc3e67e54ad0d16a670f7c9bda0959eb59cd895cfd405f2cf5bbb9236b289ff2'),
    ('0001', N'procedures/mailq.AddSuppression.sql', 'b6a91bb1bb00e829dae9b0a6be26676f5f7e990c3a1e9a61490d7079e1250700'),
    ('0001', N'procedures/mailq.RemoveSuppression.sql', 'b4d58ab81eafbe7ab1a22c9b994d1370d5b537237e3458eec1bda28c1b178d2b'),
    ('0001', N'procedures/mailq.ListSuppressions.sql', 'c63ef87749334df4e2f46b63ad169b0b84facd925f152a8f80e5d76ba747f5f9'),
    ('0001', N'procedures/mailq.GetSuppressionStats.sql', '3002368a01567fb9a54b6c8616780d87387dbc08031e8796f6ed5674001bcb03'),
    ('0001', N'procedures/mailq.PurgeBounceReports.sql', 'd072de4942d7c9e792c6bb0be1930b31346da217a116e1c2ec30bed3f5d48ea1'),
    ('0001', N'security/MailqBounceReader.grants.sql', '8c65fe2bcd239088c5d78d9f334d32b5b5c6f4457ab6673e748f0cfc80fe8b3e'),
    ('0001', N'security/MailqMonitor.role.sql', '4bd4a00e77edbc0a5feb58abe24d78083163a2d59cbea0abf3e12b35d5e0832e'),
    ('0001', N'procedures/mailq.GetQueueMetrics.sql', '4fb5f17ea204e7353bf15a39e06f00f8db3c2f2ad2c2628be772a480b9310c37'),
    ('0001', N'procedures/mailq.GetMailHistory.sql', '151c76bd5a7625e1fbed3e84b6c03902708a5eb5ebcaf4e59a5c61c97d70f28c'),
    ('0001', N'procedures/mailq.FindMail.sql', '857e285df1765570efb58ff7aea1ba3a97b83bedb6ebd6c0be38647d8fcb216d'),
    ('0001', N'security/MailqMonitor.grants.sql', 'fa1f75f71a6c9d7dc5720de0a1c474aa705a06394f6749700448948df59b35cd'),
    ('0001', N'security/MailqAdmin.monitoring.grants.sql', '9f2b9ddb38be75e0bc669eb7bd961be5dae08c5a320f5c40629a6a225d1840f5'),
    ('0001', N'security/MailqDbMailRunner.role.sql', '869c412cdc12046e6c047688d5b4172c3c5f721eb41184f47a40372fe5bdc8c2'),
    ('0001', N'procedures/mailq.ClaimDbMailQuery.sql', '25f1f06e3b2af64b16d52287db351d0ae42a467f9fb4d32d490e31b3ee65bbce'),
    ('0001', N'procedures/mailq.CompleteDbMailQuery.sql', '3c3ae331faaea88c9952518091ad81e653e2b1e8655d63b4d65bcbb486c21874'),
    ('0001', N'views/mailq.sysmail_mailattachments.sql', 'e819185cc385d1438769c091c97f105d9de766470d6a93127a8281bae4556c34'),
    ('0001', N'views/mailq.sysmail_profile.sql', '9a6fa402d177950bd6d387f9b70c2c37bcd866d2e9c6267ebace3a14eef9f994'),
    ('0001', N'views/mailq.sysmail_account.sql', '47afbf7cdeae161677054587bfcea7914aaef7a752984f7b79a0c0a7e45d351c'),
    ('0001', N'views/mailq.sysmail_profileaccount.sql', '2490a39e9023a34f615b9cfcf78b9ec8b7ad1a1f2ce05f44517894a166d3512a'),
    ('0001', N'views/mailq.sysmail_principalprofile.sql', 'd6b60798f4f00c0c391195774d7502f52b921dc6a88d882b35ba2d737eb4752e'),
    ('0001', N'views/mailq.sysmail_configuration.sql', 'ee8a70ffe6920e756a071eb79f018c19e3d1773de41eeef2b52bffe66ff6fa75'),
    ('0001', N'security/MailqDbMailRunner.grants.sql', '1a3cd1b1382b62f823da2c4e50d012809aae6411cebc40ba4cba3923eb428d2d'),
    ('0001', N'security/MailqAdmin.dbmail2.grants.sql', '223e4311c66ea19d45acf33fa8430d7514d5c2ca05386f0c235fb8382866da78'),
    ('0001', N'security/MailqDbMailUser.attachments.grants.sql', 'c6e163b55a2f5c8612d1b8c0b0db0c88a05aab399d4e0b5daa05c857b2cc0432');
DELETE FROM dbo.mailq_deployment_file WHERE Revision IN (SELECT n.Revision FROM @Files AS n)
    AND FilePath IN (SELECT n.FilePath FROM @Files AS n);
INSERT INTO dbo.mailq_deployment_file (Revision, FilePath, Sha256) SELECT n.Revision, n.FilePath, n.Sha256 FROM @Files AS n;
GO
IF @@ERROR <> 0 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'mailq-db: revision 0001 failed and was rolled back; the rest of this script is not executed.', 16, 1); SET NOEXEC ON; END;
GO
INSERT INTO dbo.mailq_alembic_version (version_num) OUTPUT inserted.version_num VALUES ('0001');
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
