/*
mailq.DbMailProfileAccount: the accounts of a profile, in failover order
(lowest SequenceNumber first, as msdb.dbo.sysmail_profileaccount).
Failover is decided when mailq.SendDbMail enqueues: the mail goes to the first
account of the profile that is not blocked (mailq.SendingAccount.BlockedUntilUtc
unset or past); when every account is blocked, to the first one (the mail waits
for it).  A queued mail keeps its account.
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
