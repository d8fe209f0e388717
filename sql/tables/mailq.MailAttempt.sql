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
