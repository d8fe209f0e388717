/*
delay.Installation: what the deployment found and did, so that a downgrade undoes
exactly that: Item = N'dbo.tabDIYTable12402', Detail = N'created' (a downgrade may
drop it) or N'adopted' (never dropped).  Written by the deployment only.
*/
IF OBJECT_ID(N'delay.Installation', N'U') IS NULL
    CREATE TABLE delay.Installation (
        Item NVARCHAR(256) NOT NULL,
        Detail NVARCHAR(400) NOT NULL,
        RecordedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Installation_RecordedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_Installation PRIMARY KEY CLUSTERED (Item)
    );
