/*
mailq.MailBatchRow: the table type of mailq.EnqueueMailBatch's @MailRows (a
table-valued parameter, for applications).  One row per mail; the columns are
mailq.EnqueueMail's parameters with the same names and types, so that a row
and a single call with the same values are the same mail (same content hash,
same validation).  RowNo is the caller's ordinal: errors and results name it.
NULL in an optional column means EnqueueMail's default.
A table type cannot be altered: a later change is a new type (or a drop and
re-create while no procedure references it), in its own revision.
Callers need EXECUTE on the type (sql/security/MailqEnqueuer.batch.grants.sql).
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
        RunMode NVARCHAR(4000) NULL
    );
