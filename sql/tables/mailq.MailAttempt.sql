/*
mailq.MailAttempt: one row per attempt to send a mail.  Opened by
mailq.ClaimMail, closed by the acknowledgement (MarkSent, MarkFailed,
ReleaseMail) or, when an expired lease is reclaimed, by the next ClaimMail
with Outcome = 'Abandoned'.
Outcome: Sent, DryRun, Retry, Wait, Stop, Released, Abandoned; NULL while open.
TemplateVersion: the template version the attempt rendered (NULL for ordinary mail).
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
