/*
mailq.DbMailItem: one row per mailq.SendDbMail call: msdb's mail item fields the
queue does not hold.  MailID: the mail (ON DELETE CASCADE); ProfileID has no
foreign key (the mail outlives its profile, as in msdb).
SendRequestDate  the server's local time (DATETIME, as msdb), indexed.
RequestUser, RequestUserSid  whose rights the query runs with (docs/database-mail.md).
QueryState    NULL (no query), Pending, Running, Done, Failed; QueryDueAtUtc: when a
              runner may take it (Pending: at once; Running: the lease expiry).
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
