/*
mailq.MailQueue: one row per mail.  The article's column names are kept
(ID, dtStamp, DateToProcess, DateProcessed, FromName, FromAddress, ToAddress,
CC, BCC, Status, ThreadLock, AttemptsRemaining, Priority, Body) and corrected:
BIGINT ID, NVARCHAR text, UTC DATETIME2(3) times, errors in LastError (never in
Status).

Status: UnSent (queued) -> Sending (leased) -> Sent | Failed | Cancelled | Expired
| Stopped (mailq.StopMail, revision 0011).  Every change of Status (and every
claim, retry and release) writes a row in mailq.MailEvent in the same
transaction (docs/events.md).

VisibleAtUtc is the one column the claim ranges over: it holds the due time
while the mail is UnSent and the lease expiry while it is Sending, so "due or
lease expired" is a single range on IX_MailQueue_Claim (an OR across two
columns cannot seek).  DateToProcess keeps the caller's requested due time.

ThreadLock    the lock token of the worker holding the lease (NULL otherwise);
              every acknowledgement is fenced by it.
AttemptCount  attempts started (claims that led to Sending); AttemptsRemaining
              is decremented at claim, so a mail that kills its worker cannot
              loop forever.  Wait and Release refund the attempt.
PossibleDuplicate  set when an expired lease is reclaimed: the first worker may
              have handed the mail to SMTP before dying.
ContentHash   SHA-256 of the enqueued content; an idempotency key reused with
              different content is refused (error 50116).
MessageID     RFC 5322 Message-ID made at enqueue, sent unchanged by every
              attempt so that receivers can drop duplicates.
IdempotencyKey compared as binary text (COLLATE Latin1_General_100_BIN2),
              like the sp_getapplock resource mailq.EnqueueMail locks on.
Body, TextBody, Headers  stored out of row (table option 'large value types
              out of row' = 1, revision 0007): the clustered row keeps a
              16-byte pointer, so claims and counts read narrow rows.
RunMode       the run mode the mail was enqueued under ('prod', 'staging',
              'test', ...; default 'prod'): only workers configured for it
              claim it (docs/run-modes.md, revision 0015).
DryRun        stamped by every claim from the application's DryRun flag and
              kept by the acknowledgement (mailq.MarkSent): 1 = recorded as
              sent, reached no server.
TemplateName, TemplateVersion, TemplateModel (revision 0016): mail enqueued
              with a template; Body and Subject are N'' then and the worker
              renders them at send time (docs/templates.md).  TemplateVersion
              NULL: the latest active version when claimed.
Revisions 0007, 0011, 0015 and 0016 changed an existing table in place
(sql/upgrades/mailq.0007.MailQueue.sql, mailq.0011.MailQueue.sql,
mailq.0015.MailQueue.sql, mailq.0016.MailQueue.sql); this file shows the
current shape.
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
END;
