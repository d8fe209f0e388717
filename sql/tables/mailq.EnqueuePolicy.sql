/*
mailq.EnqueuePolicy: who may enqueue without an application, one row.
    AllowUnmappedEnqueuers  0 (a new installation): a database user that no
        mailq.ApplicationPrincipal row maps to an application is refused by
        EnqueueMail, EnqueueMailBatch and SendDbMail (50500); 1: the opt-in of
        mailq.SetEnqueuePolicy, such a user enqueues unbound.
    ChangedAtUtc, ChangedBy  when and by whom (ORIGINAL_LOGIN()) it was last set.
Written only by mailq.SetEnqueuePolicy; read by the enqueue core
(mailq.EnqueueMailRows) and mailq.GetEnqueuePolicy (docs/enqueue.md, "Who may
send as whom").
*/
IF OBJECT_ID(N'mailq.EnqueuePolicy', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.EnqueuePolicy (
        PolicyId TINYINT NOT NULL CONSTRAINT DF_EnqueuePolicy_PolicyId DEFAULT (1),
        AllowUnmappedEnqueuers BIT NOT NULL CONSTRAINT DF_EnqueuePolicy_AllowUnmapped DEFAULT (0),
        ChangedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_EnqueuePolicy_ChangedAtUtc DEFAULT (SYSUTCDATETIME()),
        ChangedBy NVARCHAR(128) NULL,
        CONSTRAINT PK_EnqueuePolicy PRIMARY KEY CLUSTERED (PolicyId),
        CONSTRAINT CK_EnqueuePolicy_SingleRow CHECK (PolicyId = 1)
    );
    INSERT INTO mailq.EnqueuePolicy (PolicyId, AllowUnmappedEnqueuers) VALUES (1, 0);
END;
