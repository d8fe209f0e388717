/*
mailq.ApplicationFrom: the From addresses and domains each application may
send as.  FromPattern is one address ('billing@example.com') or a domain
('@example.com': that domain, not its subdomains), stored in lower case under
a binary collation; mailq.EnqueueMail lowers the From address and compares
(50161 otherwise).  Written by mailq.BindApplication and UnbindApplication.
*/
IF OBJECT_ID(N'mailq.ApplicationFrom', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.ApplicationFrom (
        AppName NVARCHAR(128) NOT NULL,
        FromPattern NVARCHAR(320) COLLATE Latin1_General_100_BIN2 NOT NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_ApplicationFrom_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_ApplicationFrom PRIMARY KEY CLUSTERED (AppName, FromPattern),
        CONSTRAINT FK_ApplicationFrom_Application FOREIGN KEY (AppName)
        REFERENCES mailq.Application (AppName),
        CONSTRAINT CK_ApplicationFrom_Lower CHECK (FromPattern = LOWER(FromPattern) AND LEN(FromPattern) > 1)
    );
END;
