/*
delay.DisallowProcedure: removes a procedure from the allow-list.  Tasks already
scheduled for it are refused when they come due (receipt 2, 50306).
Parameters:  @ProcedureName NVARCHAR(4000), required: schema.procedure as listed
Result set:  none.
Errors:      50314 @ProcedureName is not on the allow-list
Transaction: joins the caller's (a single DELETE).
Security:    for db_owner only, like delay.AllowProcedure.
Example:     EXEC delay.DisallowProcedure @ProcedureName = N'dbo.TCXG';
*/
CREATE OR ALTER PROCEDURE delay.DisallowProcedure
    @ProcedureName NVARCHAR(4000)
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);

    DELETE ap
    FROM delay.AllowedProcedure AS ap
    WHERE
        DATALENGTH(@ProcedureName) BETWEEN 2 AND 256
        AND ap.SchemaName = PARSENAME(@ProcedureName, 2)
        AND ap.ProcedureName = PARSENAME(@ProcedureName, 1)
        AND PARSENAME(@ProcedureName, 3) IS NULL;

    IF @@ROWCOUNT = 0
    BEGIN
        SET @Msg = CONCAT(
            N'@ProcedureName is not on the allow-list; got ', ISNULL(LEFT(@ProcedureName, 300), N'NULL'), N'.'
        );
        THROW 50314, @Msg, 1;
    END;
END;
