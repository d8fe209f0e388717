/*
mailq.DbMailPrincipalProfile: who may use a profile, and each principal's
default profile (msdb.dbo.sysmail_principalprofile).  PrincipalName is a
database user or role of this database, or N'public' for a public profile.
IsDefault = 1 marks the principal's default (at most one per principal,
UX_DbMailPrincipalProfile_Default); the default of N'public' is the default
public profile.
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
