/*
mailq.DbMailAccount: the INT account_id Database Mail's views show
(sent_account_id, account_id) for a sending account of mailq.SendingAccount.
A row is made when the account is first added to a profile
(mailq.UpsertDbMailProfileAccount); it is never reused for another account.
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
