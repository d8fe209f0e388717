/*
UX_AllowedProcedure_BareName: a bare (one-part) name resolves to at most one
listed procedure, so dbo.TCXG and app.TCXG cannot both answer to N'TCXG'.
Filtered: entries that do not allow a bare name are not constrained.
*/
IF NOT EXISTS (
    SELECT 1 FROM sys.indexes
    WHERE name = N'UX_AllowedProcedure_BareName' AND object_id = OBJECT_ID(N'delay.AllowedProcedure')
)
    CREATE UNIQUE NONCLUSTERED INDEX UX_AllowedProcedure_BareName
        ON delay.AllowedProcedure (ProcedureName)
        WHERE AllowBareName = 1;
