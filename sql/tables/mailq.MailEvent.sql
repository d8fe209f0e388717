/*
mailq.MailEvent: the append-only event stream of the mail queue (issue 16,
point 1).  Every state change of a mail writes one row in the same
transaction as the change (docs/events.md lists which procedure writes which
EventType).  Rows are never updated; mailq.PurgeMail deletes them with their
mail.

EventSeq      ROWVERSION: the database's rowversion counter, stamped when the
              row is inserted (rowversion (Transact-SQL), Remarks:
              https://learn.microsoft.com/sql/t-sql/data-types/rowversion-transact-sql).
              Exposed as EventID BIGINT by mailq.GetMailEvents, which reads
              only rows below MIN_ACTIVE_ROWVERSION(): every value below it
              belongs to a transaction that has ended, so an event can never
              appear later with an ID a reader already passed (the cursor is
              commit-safe; an IDENTITY is not).  The rowversion docs call it a
              poor key because an UPDATE changes it: this table is never
              updated, so the key never moves.
EventType     Enqueued, Claimed, Sent, DryRun, RetryScheduled, AccountWaiting,
              Released, LeaseExpired, Failed, Cancelled, Expired, Stopped,
              Requeued.
Status        the mail's status right after the change.
AttemptCount  the mail's AttemptCount right after the change.
SmtpCode, Detail  the server's reply code and text, the error, or the reason
              given to mailq.StopMail, where there is one.

No CHECK constraint, no foreign key and no trigger, on purpose: the
procedures write this table through OUTPUT ... INTO, whose target "can't
have enabled triggers defined on it", "can't participate on either side of
a FOREIGN KEY constraint" and "can't have CHECK constraints or enabled
rules" (OUTPUT clause (Transact-SQL), Arguments, output_table:
https://learn.microsoft.com/sql/t-sql/queries/output-clause-transact-sql).
The procedures are the only writers (no role has table rights), and
tests/static/test_events_static.py checks the EventType values they write.
A later per-application hook must read the stream, never add a trigger here.
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
