/*
mailq.DbMailProfile: a Database Mail profile (msdb.dbo.sysmail_profile): an ordered
list of sending accounts (mailq.DbMailProfileAccount); ProfileID is the profile_id
the sysmail_* views show.
*/
IF OBJECT_ID(N'mailq.DbMailProfile', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailProfile (
        ProfileID INT IDENTITY (1, 1) NOT NULL,
        ProfileName NVARCHAR(128) NOT NULL,
        Description NVARCHAR(256) NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_DbMailProfile_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_DbMailProfile PRIMARY KEY CLUSTERED (ProfileID),
        CONSTRAINT UQ_DbMailProfile_ProfileName UNIQUE (ProfileName)
    );
END;
