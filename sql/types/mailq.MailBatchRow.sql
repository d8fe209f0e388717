/*
mailq.MailBatchRow: the table type of mailq.EnqueueMailBatch's @MailRows (a TVP).
One row per mail: mailq.EnqueueMail's parameters with the same names and types,
so a row and a single call with the same values are the same mail; RowNo is the
caller's ordinal, named by errors and results; NULL means EnqueueMail's default.
A type in use (mailq.EnqueueMailBatch, mailq.EnqueueMailRows) can be neither
altered nor dropped: a later shape is a new type.  Callers need EXECUTE on it
(sql/security/MailqEnqueuer.batch.grants.sql).
*/
IF TYPE_ID(N'mailq.MailBatchRow') IS NULL
    CREATE TYPE mailq.MailBatchRow AS TABLE (
        RowNo INT NOT NULL PRIMARY KEY,
        ToAddress NVARCHAR(MAX) NULL,
        Subject NVARCHAR(MAX) NULL,
        Body NVARCHAR(MAX) NULL,
        BodyFormat NVARCHAR(20) NULL,
        TextBody NVARCHAR(MAX) NULL,
        CC NVARCHAR(MAX) NULL,
        BCC NVARCHAR(MAX) NULL,
        FromAddress NVARCHAR(MAX) NULL,
        FromName NVARCHAR(MAX) NULL,
        ReplyTo NVARCHAR(MAX) NULL,
        Headers NVARCHAR(MAX) NULL,
        AccountName NVARCHAR(4000) NULL,
        AppName NVARCHAR(4000) NULL,
        Priority INT NULL,
        DateToProcess DATETIME2(3) NULL,
        ExpiresAtUtc DATETIME2(3) NULL,
        MaxAttempts INT NULL,
        IdempotencyKey NVARCHAR(4000) NULL,
        Attachments NVARCHAR(MAX) NULL,
        RunMode NVARCHAR(4000) NULL,
        TemplateName NVARCHAR(4000) NULL,
        TemplateVersion INT NULL,
        TemplateModel NVARCHAR(MAX) NULL
    );
