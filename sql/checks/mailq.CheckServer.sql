/*
Deployment pre-check (the baseline's first file; creates and changes nothing):
    50402  database compatibility level below 130 (OPENJSON, STRING_SPLIT)
    50403  SQL Server older than 2019 (major version 15) outside Azure
*/
DECLARE @CompatibilityLevel INT = (
    SELECT d.compatibility_level
    FROM sys.databases AS d
    WHERE d.database_id = DB_ID()
);
DECLARE @EngineEdition INT = CAST(SERVERPROPERTY(N'EngineEdition') AS INT);
DECLARE @MajorVersion INT = CAST(SERVERPROPERTY(N'ProductMajorVersion') AS INT);
DECLARE @Msg NVARCHAR(2048);
IF @CompatibilityLevel < 130
BEGIN
    SET @Msg = CONCAT(
        N'mailq-db needs database compatibility level 130 or higher (OPENJSON, STRING_SPLIT); ',
        N'database ', QUOTENAME(DB_NAME()), N' has ', @CompatibilityLevel, N'. ',
        N'A DBA can raise it with: ALTER DATABASE ', QUOTENAME(DB_NAME()),
        N' SET COMPATIBILITY_LEVEL = 150; (test the application first: the level changes query optimisation).'
    );
    THROW 50402, @Msg, 1;
END;
-- EngineEdition 5, 8: Azure SQL Database and Managed Instance (versionless).
IF @EngineEdition NOT IN (5, 8) AND @MajorVersion < 15
BEGIN
    SET @Msg = CONCAT(
        N'mailq-db needs SQL Server 2019 (major version 15) or later; this server reports ',
        @MajorVersion, N'.'
    );
    THROW 50403, @Msg, 1;
END;
