/*
mailq.ApplicationFrom: the From addresses and domains an application may send as
(else 50161).  FromPattern: an address or '@domain' (not its subdomains), lower
case, binary collation.
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
