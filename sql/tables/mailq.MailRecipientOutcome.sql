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
