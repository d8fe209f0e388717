/*
mailq.DbMailPrincipalProfile: who may use a profile (a user, a role or N'public')
and each principal's default (IsDefault, at most one).
*/
IF OBJECT_ID(N'mailq.DbMailPrincipalProfile', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailPrincipalProfile (
        PrincipalName NVARCHAR(128) NOT NULL,
        ProfileID INT NOT NULL,
        IsDefault BIT NOT NULL CONSTRAINT DF_DbMailPrincipalProfile_IsDefault DEFAULT (0),
        CONSTRAINT PK_DbMailPrincipalProfile PRIMARY KEY CLUSTERED (PrincipalName, ProfileID),
        CONSTRAINT FK_DbMailPrincipalProfile_DbMailProfile FOREIGN KEY (ProfileID)
        REFERENCES mailq.DbMailProfile (ProfileID)
    );
END;
