/*
mailq.ApplicationAccount: the sending accounts an application may send through
(else EnqueueMail refuses, 50160).
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
