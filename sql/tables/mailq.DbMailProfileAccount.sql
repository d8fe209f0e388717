/*
mailq.DbMailProfileAccount: a profile's accounts in failover order (lowest
SequenceNumber first); SendDbMail picks the first not blocked at enqueue.
*/
IF OBJECT_ID(N'mailq.DbMailProfileAccount', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailProfileAccount (
        ProfileID INT NOT NULL,
        AccountID INT NOT NULL,
        SequenceNumber INT NOT NULL,
        CONSTRAINT PK_DbMailProfileAccount PRIMARY KEY CLUSTERED (ProfileID, AccountID),
        CONSTRAINT FK_DbMailProfileAccount_DbMailProfile FOREIGN KEY (ProfileID)
        REFERENCES mailq.DbMailProfile (ProfileID),
        CONSTRAINT FK_DbMailProfileAccount_DbMailAccount FOREIGN KEY (AccountID)
        REFERENCES mailq.DbMailAccount (AccountID),
        CONSTRAINT CK_DbMailProfileAccount_SequenceNumber CHECK (SequenceNumber >= 0)
    );
END;
