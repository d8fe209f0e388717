/*
mailq.MailEvent: the append-only event stream of the mail queue: every state
change of a mail writes one row in the same transaction (docs/events.md lists
which procedure writes which EventType).  Never updated; mailq.PurgeMail
deletes a mail's events with it.
EventSeq      ROWVERSION, read below MIN_ACTIVE_ROWVERSION() by
              mailq.GetMailEvents (as EventID BIGINT): a commit-safe cursor.
EventType     Enqueued, Claimed, Sent, DryRun, RetryScheduled, AccountWaiting,
              Released, LeaseExpired, Failed, Cancelled, Expired, Stopped, Requeued.
Status, AttemptCount  the mail's, right after the change.
SmtpCode, Detail      the server's reply, the error, or StopMail's reason.
No CHECK, foreign key or trigger: the procedures write it through OUTPUT ...
INTO, whose target may have none (a hook reads the stream instead).
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
