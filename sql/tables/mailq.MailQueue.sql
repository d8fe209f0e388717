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
