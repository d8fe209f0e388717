/*
mailq.SuppressionHistory: every addition, renewal and removal of a
suppression, with who did it and why (the audit an operator is asked for
when a customer says "I never unsubscribed").  Append-only; written by
mailq.ApplySuppressions and mailq.RemoveSuppression.
Action: Added, Renewed (an existing row got a new reason, source or
expiry), Removed.  AppName N'' as in mailq.Suppression.
*/
IF OBJECT_ID(N'mailq.SuppressionHistory', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.SuppressionHistory (
        HistoryID BIGINT IDENTITY (1, 1) NOT NULL,
        AccountName NVARCHAR(128) NOT NULL,
        Address NVARCHAR(320) NOT NULL,
        AppName NVARCHAR(128) NOT NULL,
        Action NVARCHAR(16) NOT NULL,
        Reason NVARCHAR(16) NOT NULL,
        Source NVARCHAR(200) NOT NULL,
        Detail NVARCHAR(1000) NULL,
        MailID BIGINT NULL,
        OccurredAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_SuppressionHistory_OccurredAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_SuppressionHistory PRIMARY KEY CLUSTERED (HistoryID),
        CONSTRAINT CK_SuppressionHistory_Action CHECK (Action IN (N'Added', N'Renewed', N'Removed'))
    );
END;
