/*
mailq.Suppression: addresses that a sending account (or one application on
it) must no longer mail (docs/bounces.md).  One row per (account, address,
application); AppName N'' means every application of the account.
Reason       HardBounce (the address does not exist: after the configured
             number of hard bounces, default 1), SoftBounce (after the
             configured number of soft bounces, off by default), Complaint
             (a spam complaint: at once, account-wide), Unsubscribe (the
             recipient asked: the application that sent the mail, or the
             whole account for mail without one), Manual (an operator).
Source, Detail  who or what added it and why (the report's status and text,
             the unsubscribe link, the operator's note).
MailID       the mail that caused it, if any (no foreign key: mail is purged,
             the suppression stays).
ExpiresAtUtc NULL: forever; else the row stops applying at that time.
Address is stored lower-case (the rule every enqueue compares with).
Written only by mailq.ApplySuppressions and mailq.RemoveSuppression; read by
mailq.FilterSuppressedRecipients at every enqueue (one seek per recipient).
*/
IF OBJECT_ID(N'mailq.Suppression', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.Suppression (
        AccountName NVARCHAR(128) NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AppName NVARCHAR(128) NOT NULL CONSTRAINT DF_Suppression_AppName DEFAULT (N''),
        Reason NVARCHAR(16) NOT NULL,
        Source NVARCHAR(200) NOT NULL,
        Detail NVARCHAR(1000) NULL,
        MailID BIGINT NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Suppression_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        UpdatedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Suppression_UpdatedAtUtc DEFAULT (SYSUTCDATETIME()),
        ExpiresAtUtc DATETIME2(3) NULL,
        CONSTRAINT PK_Suppression PRIMARY KEY CLUSTERED (AccountName, Address, AppName),
        CONSTRAINT FK_Suppression_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName),
        CONSTRAINT CK_Suppression_Reason CHECK (
            Reason IN (N'HardBounce', N'SoftBounce', N'Complaint', N'Unsubscribe', N'Manual')
        ),
        CONSTRAINT CK_Suppression_Address CHECK (Address = LOWER(Address) AND Address LIKE N'%_@_%')
    );
END;
