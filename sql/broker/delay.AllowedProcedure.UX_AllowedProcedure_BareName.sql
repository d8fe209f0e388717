/*
UX_AllowedProcedure_BareName: a bare name resolves to at most one listed procedure
(dbo.TCXG and app.TCXG cannot both answer to N'TCXG').  Filtered; only
delay.AllowProcedure (db_owner) writes the table.
*/
IF NOT EXISTS (
    SELECT 1 FROM sys.indexes
    WHERE name = N'UX_AllowedProcedure_BareName' AND object_id = OBJECT_ID(N'delay.AllowedProcedure')
)
    CREATE UNIQUE NONCLUSTERED INDEX UX_AllowedProcedure_BareName ON delay.AllowedProcedure (ProcedureName)
        WHERE AllowBareName = 1;
