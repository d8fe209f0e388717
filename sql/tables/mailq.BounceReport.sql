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
