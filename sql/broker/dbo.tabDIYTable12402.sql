/*
dbo.tabDIYTable12402: the low-code platform's trigger table, created if absent,
adopted if the platform already made it.  Columns (the platform's names): ID
identity (the task ID), F108210 description, F108211 target name, F108212-F108216
the target's @Param1-@Param5, F108217 created time (UTC when created here),
F108218 delay in seconds, F108219 receipt: 0 pending, 1 done, 2 refused,
3 failed, 4 cancelled (NULL counts as 0).  Rows inserted with a non-zero receipt
or a NULL name are left alone.  Once scheduled a row is informational: its values
were copied into delay.Task, and an UPDATE of them changes nothing that runs.
Adoption: an existing table gains only the columns it lacks, added NULL (metadata
only, no row rewritten); nothing is dropped or updated.  It needs an identity ID
and an integer F108219, else the deployment stops with 50390 and changes nothing.
delay.Installation records N'created' or N'adopted'; only a created table is dropped.
*/
IF OBJECT_ID(N'dbo.tabDIYTable12402', N'U') IS NULL
BEGIN
    CREATE TABLE dbo.tabDIYTable12402 (
        ID BIGINT IDENTITY (1, 1) NOT NULL,
        F108210 NVARCHAR(50) NULL,
        F108211 NVARCHAR(400) NULL,
        F108212 NVARCHAR(200) NULL,
        F108213 NVARCHAR(200) NULL,
        F108214 NVARCHAR(200) NULL,
        F108215 NVARCHAR(200) NULL,
        F108216 NVARCHAR(200) NULL,
        F108217 DATETIME2(3) NULL CONSTRAINT DF_tabDIYTable12402_F108217 DEFAULT (SYSUTCDATETIME()),
        F108218 INT NULL CONSTRAINT DF_tabDIYTable12402_F108218 DEFAULT (0),
        F108219 INT NULL CONSTRAINT DF_tabDIYTable12402_F108219 DEFAULT (0),
        CONSTRAINT PK_tabDIYTable12402 PRIMARY KEY CLUSTERED (ID)
    );
    INSERT INTO delay.Installation (Item, Detail) VALUES (N'dbo.tabDIYTable12402', N'created');
END;
ELSE
BEGIN
    -- COLUMNPROPERTY is NULL when the column is missing, 0 when it is no identity.
    IF ISNULL(COLUMNPROPERTY(OBJECT_ID(N'dbo.tabDIYTable12402'), N'ID', 'IsIdentity'), 0) <> 1
        THROW 50390, N'dbo.tabDIYTable12402 exists but has no identity column ID (the task ID). Nothing changed.', 1;
    IF EXISTS (
        SELECT 1
        FROM sys.columns AS c
        INNER JOIN sys.types AS t ON c.user_type_id = t.user_type_id
        WHERE
            c.object_id = OBJECT_ID(N'dbo.tabDIYTable12402') AND c.name = N'F108219'
            AND t.name NOT IN (N'tinyint', N'smallint', N'int', N'bigint', N'decimal', N'numeric')
    )
        THROW 50390, N'dbo.tabDIYTable12402.F108219 (receipt) must be an integer type. Nothing changed.', 1;
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108210') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108210 NVARCHAR(50) NULL;
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108211') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108211 NVARCHAR(400) NULL;
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108212') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108212 NVARCHAR(200) NULL;
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108213') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108213 NVARCHAR(200) NULL;
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108214') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108214 NVARCHAR(200) NULL;
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108215') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108215 NVARCHAR(200) NULL;
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108216') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108216 NVARCHAR(200) NULL;
    -- Without WITH VALUES: existing rows read NULL, new rows get the default (metadata only).
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108217') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108217 DATETIME2(3) NULL
            CONSTRAINT DF_tabDIYTable12402_F108217 DEFAULT (SYSUTCDATETIME());
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108218') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108218 INT NULL CONSTRAINT DF_tabDIYTable12402_F108218 DEFAULT (0);
    IF COL_LENGTH(N'dbo.tabDIYTable12402', N'F108219') IS NULL
        ALTER TABLE dbo.tabDIYTable12402 ADD F108219 INT NULL CONSTRAINT DF_tabDIYTable12402_F108219 DEFAULT (0);
    INSERT INTO delay.Installation (Item, Detail) VALUES (N'dbo.tabDIYTable12402', N'adopted');
END;
