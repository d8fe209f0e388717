/*
mailq.DbMailItem: one row per mailq.SendDbMail call (msdb.dbo.sysmail_mailitems's
part that the queue does not hold): the INT mailitem_id, the profile, importance
and sensitivity, the query and its options, who asked and when.  MailID is the
queued mail (deleted with it: ON DELETE CASCADE, so mailq.PurgeMail needs no
change); ProfileID has no foreign key: a profile can be deleted while its mail
is kept, as msdb keeps profile_id.
SendRequestDate  the server's local time of the call (DATETIME, as msdb stores
              it), so the sysmail_* views filter on a stored, indexed column.
RequestUser, RequestUserSid  the database user (USER_NAME(), USER_SID()) whose
              rights the query runs with: the query runner impersonates it and
              checks the SID (docs/database-mail.md, "How @query runs").
QueryState    NULL (no query); Pending, Running (a runner holds it until
              QueryDueAtUtc), Done, Failed.  QueryDueAtUtc is when a runner may
              take it (Pending: at once; Running: the lease expiry), so one
              range on IX_DbMailItem_QueryDue finds both.
*/
IF OBJECT_ID(N'mailq.DbMailItem', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailItem (
        MailItemID INT IDENTITY (1, 1) NOT NULL,
        MailID BIGINT NOT NULL,
        ProfileID INT NOT NULL,
        Importance VARCHAR(6) NOT NULL,
        Sensitivity VARCHAR(12) NOT NULL,
        Query NVARCHAR(MAX) NULL,
        ExecuteQueryDatabase NVARCHAR(128) NULL,
        AttachQueryResultAsFile BIT NOT NULL,
        QueryAttachmentFilename NVARCHAR(260) NULL,
        QueryResultHeader BIT NOT NULL,
        QueryResultWidth INT NOT NULL,
        QueryResultSeparator NCHAR(1) NOT NULL,
        ExcludeQueryOutput BIT NOT NULL,
        AppendQueryError BIT NOT NULL,
        QueryNoTruncate BIT NOT NULL CONSTRAINT DF_DbMailItem_QueryNoTruncate DEFAULT (0),
        QueryResultNoPadding BIT NOT NULL CONSTRAINT DF_DbMailItem_QueryResultNoPadding DEFAULT (0),
        QueryResultFormat VARCHAR(4) NOT NULL CONSTRAINT DF_DbMailItem_QueryResultFormat DEFAULT ('TEXT'),
        SendRequestUser NVARCHAR(128) NOT NULL,
        SendRequestDate DATETIME NOT NULL,
        RequestUser NVARCHAR(128) NOT NULL,
        RequestUserSid VARBINARY(85) NULL,
        QueryState NVARCHAR(16) NULL,
        QueryDueAtUtc DATETIME2(3) NULL,
        QueryLockToken UNIQUEIDENTIFIER NULL,
        QueryAttempts INT NOT NULL CONSTRAINT DF_DbMailItem_QueryAttempts DEFAULT (0),
        QueryError NVARCHAR(4000) NULL,
        QueryFinishedAtUtc DATETIME2(3) NULL,
        CONSTRAINT PK_DbMailItem PRIMARY KEY CLUSTERED (MailItemID),
        CONSTRAINT UQ_DbMailItem_MailID UNIQUE (MailID),
        CONSTRAINT FK_DbMailItem_MailQueue FOREIGN KEY (MailID)
        REFERENCES mailq.MailQueue (ID) ON DELETE CASCADE,
        CONSTRAINT CK_DbMailItem_QueryState CHECK (
            (QueryState IS NULL AND Query IS NULL)
            OR (QueryState IN (N'Pending', N'Running', N'Done', N'Failed') AND Query IS NOT NULL)
        ),
        CONSTRAINT CK_DbMailItem_QueryLease CHECK (
            (QueryState = N'Running' AND QueryLockToken IS NOT NULL AND QueryDueAtUtc IS NOT NULL)
            OR (QueryState = N'Pending' AND QueryLockToken IS NULL AND QueryDueAtUtc IS NOT NULL)
            OR (QueryState IS NULL OR QueryState IN (N'Done', N'Failed'))
        ),
        CONSTRAINT CK_DbMailItem_QueryResultFormat CHECK (QueryResultFormat IN ('TEXT', 'HTML', 'CSV'))
    );
END;
