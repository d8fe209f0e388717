/*
mailq.DbMailAccount: the INT account_id the sysmail_* views show for a sending
account, made when first added to a profile, never reused.
*/
IF OBJECT_ID(N'mailq.DbMailAccount', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailAccount (
        AccountID INT IDENTITY (1, 1) NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        CONSTRAINT PK_DbMailAccount PRIMARY KEY CLUSTERED (AccountID),
        CONSTRAINT UQ_DbMailAccount_AccountName UNIQUE (AccountName),
        CONSTRAINT FK_DbMailAccount_SendingAccount FOREIGN KEY (AccountName)
        REFERENCES mailq.SendingAccount (AccountName)
    );
END;
