/*
mailq.DbMailItem: what a mailq.SendDbMail call asked for beyond the queued
mail itself (profile, importance, sensitivity, the query and its options, the
caller), so that the sysmail_* views can show Database Mail's columns.
One row per mail enqueued by SendDbMail; deleted with its mail (ON DELETE
CASCADE, so mailq.PurgeMail needs no change).  ProfileID has no foreign
key on purpose: a profile can be deleted while its mail is kept (msdb keeps
profile_id in sysmail_mailitems the same way).
*/
IF OBJECT_ID(N'mailq.DbMailItem', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.DbMailItem (
        MailID BIGINT NOT NULL,
        ProfileID INT NOT NULL,
        Importance VARCHAR(6) NOT NULL,
        Sensitivity VARCHAR(12) NOT NULL,
        Query NVARCHAR(MAX) NULL,
        ExecuteQueryDatabase NVARCHAR(128) NULL,
        AttachQueryResultAsFile BIT NOT NULL,
        QueryResultHeader BIT NOT NULL,
        QueryResultWidth INT NOT NULL,
        QueryResultSeparator CHAR(1) NOT NULL,
        ExcludeQueryOutput BIT NOT NULL,
        AppendQueryError BIT NOT NULL,
        SendRequestUser NVARCHAR(128) NOT NULL,
        CONSTRAINT PK_DbMailItem PRIMARY KEY CLUSTERED (MailID),
        CONSTRAINT FK_DbMailItem_MailQueue FOREIGN KEY (MailID)
        REFERENCES mailq.MailQueue (ID) ON DELETE CASCADE
    );
END;
