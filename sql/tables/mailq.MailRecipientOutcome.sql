/*
mailq.MailRecipientOutcome: what each recipient of a mail got, when the
server accepted the mail for some recipients and not for others (written by
mailq.RecordRecipientOutcomes; the worker writes nothing here for a mail that
every recipient accepted).  One row per (mail, lower-case address), replaced
by later attempts until it is Delivered or Refused.
Outcome: Delivered (the server took the mail for this recipient: a later
attempt never sends to it again), Deferred (4xx: retried, for this recipient
only, with the mail's next attempt), Refused (5xx: final for this recipient).
Rows go with their mail: mailq.PurgeMail deletes them first, 1,000 rows per
statement (below lock escalation); ON DELETE CASCADE covers any other delete.
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
