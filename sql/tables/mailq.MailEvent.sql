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
