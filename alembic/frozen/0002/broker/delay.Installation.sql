/*
delay.Installation: what the deployment of delayed execution found and did,
so that a downgrade undoes exactly that and nothing more.
One row per fact, e.g. Item = N'dbo.tabDIYTable12402', Detail = N'created'
(mailq-db created the platform table: downgrade may drop it) or N'adopted'
(the platform had it: downgrade never drops it, and never drops the columns
that the adoption added, because the platform may have written data into them).
Written by the deployment only; no role has rights on it.
*/
IF OBJECT_ID(N'delay.Installation', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Installation (
        Item NVARCHAR(256) NOT NULL,
        Detail NVARCHAR(400) NOT NULL,
        RecordedAtUtc DATETIME2(3) NOT NULL
            CONSTRAINT DF_Installation_RecordedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_Installation PRIMARY KEY CLUSTERED (Item)
    );
END;
