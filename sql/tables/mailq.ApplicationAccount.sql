/*
mailq.ApplicationAccount: the sending accounts each application may send
through (issue 10, point 10).  mailq.EnqueueMail refuses a mail whose
@AppName is not bound to its account (error 50160).  Rows are written by
mailq.BindApplication and mailq.UnbindApplication (MailqAdmin only).
Revision 0007 seeded one row per (application, account) pair found in the
queue, and bound applications without mail to every account that existed,
so that applications kept working through the upgrade.
*/
IF OBJECT_ID(N'mailq.ApplicationAccount', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationAccount (
        AppName NVARCHAR(128) NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationAccount_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_ApplicationAccount PRIMARY KEY CLUSTERED (AppName, AccountName),
        CONSTRAINT FK_ApplicationAccount_Application FOREIGN KEY (AppName)
        REFERENCES mailq.Application (AppName),
        CONSTRAINT FK_ApplicationAccount_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName)
    );
END;
