/*
dbo.InitiateDelayExecution: schedules one allow-listed procedure to run after a
delay; inserts one row into dbo.tabDIYTable12402, whose trigger schedules it.
Parameters (the source document's names and order):
    @F108211 NVARCHAR(4000)  target procedure: N'schema.proc', or a bare N'proc'
                             listed with AllowBareName = 1 (see delay.AllowProcedure)
    @F108218 INT             delay in seconds, 0-31,536,000 (365 days)
    @F108212 ... @F108216 NVARCHAR(MAX) = NULL: the target's @Param1 ... @Param5,
                             at most 200 characters each (the target's contract)
    @F108210 NVARCHAR(50) = NULL   description (the platform's F108210)
    @TaskID  BIGINT = NULL OUTPUT  the new task's ID (dbo.tabDIYTable12402.ID)
Result set:  one row, one column: TaskID BIGINT (the same value as @TaskID), for
             clients that read a result rather than an OUTPUT parameter.
Errors:      50301 @F108211 missing; 50302 @F108218 outside 0-31,536,000;
             50303 a parameter longer than 200 characters;
             50304 @F108211 malformed or longer than 128 characters;
             50305 @F108211 has three or four parts; 50306 not on the allow-list;
             50307 listed, but the procedure was dropped, recreated or moved
Transaction: joins the caller's via a savepoint, else opens its own.  The task
             is scheduled when that transaction commits; if it rolls back,
             nothing is scheduled.
Security:    EXECUTE AS OWNER (dbo) so that name resolution sees every procedure
             in sys.objects; callers need only EXECUTE (role MailqDelayCaller).
Example:     DECLARE @TaskID BIGINT;
             EXEC dbo.InitiateDelayExecution @F108211 = N'dbo.TCXG', @F108218 = 60,
                 @F108212 = N'A-1', @TaskID = @TaskID OUTPUT;
*/
CREATE OR ALTER PROCEDURE dbo.InitiateDelayExecution
    @F108211 NVARCHAR(4000),
    @F108218 INT,
    @F108212 NVARCHAR(MAX) = NULL,
    @F108213 NVARCHAR(MAX) = NULL,
    @F108214 NVARCHAR(MAX) = NULL,
    @F108215 NVARCHAR(MAX) = NULL,
    @F108216 NVARCHAR(MAX) = NULL,
    @F108210 NVARCHAR(50) = NULL,
    @TaskID BIGINT = NULL OUTPUT
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE
        @Msg NVARCHAR(2048),
        @MaxDelaySeconds INT = 31536000,
        @BadParameter SYSNAME,
        @BadLength BIGINT,
        @Refusal INT,
        @RefusalMessage NVARCHAR(400),
        @TaskState NVARCHAR(16);

    SET @TaskID = NULL;

    -- 1. Validate parameters before any transaction starts.
    IF NULLIF(@F108211, N'') IS NULL
        THROW 50301, N'@F108211 (target procedure name) is required.', 1;

    IF @F108218 IS NULL OR @F108218 NOT BETWEEN 0 AND @MaxDelaySeconds
    BEGIN
        SET @Msg = CONCAT(
            N'@F108218 (delay) must be 0-', @MaxDelaySeconds, N' seconds; got ',
            ISNULL(CAST(@F108218 AS NVARCHAR(20)), N'NULL'), N'.'
        );
        THROW 50302, @Msg, 1;
    END;

    SELECT TOP (1)
        @BadParameter = v.ParameterName,
        @BadLength = v.ValueLength
    FROM (
        VALUES
        (N'@F108212', LEN(@F108212)),
        (N'@F108213', LEN(@F108213)),
        (N'@F108214', LEN(@F108214)),
        (N'@F108215', LEN(@F108215)),
        (N'@F108216', LEN(@F108216))
    ) AS v(ParameterName, ValueLength)
    WHERE v.ValueLength > 200
    ORDER BY v.ParameterName;

    IF @BadParameter IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(
            @BadParameter, N' must be at most 200 characters (the target''s @Param contract); got ',
            @BadLength, N'.'
        );
        THROW 50303, @Msg, 1;
    END;

    SELECT
        @Refusal = r.RefusalNumber,
        @RefusalMessage = r.RefusalMessage
    FROM delay.ResolveTarget(@F108211) AS r;

    IF @Refusal IS NOT NULL
    BEGIN
        SET @Msg = CONCAT(N'@F108211: ', @RefusalMessage, N'.');
        THROW @Refusal, @Msg, 1;
    END;

    -- 2. Own the transaction, or nest in the caller's with a savepoint.
    DECLARE @TranCount INT = @@TRANCOUNT;
    BEGIN TRY
        IF @TranCount = 0
            BEGIN TRANSACTION;
        ELSE
            SAVE TRANSACTION InitiateDelayExecution;

        INSERT INTO dbo.tabDIYTable12402 (
            F108210, F108211, F108212, F108213, F108214, F108215, F108216, F108218, F108219
        )
        VALUES (@F108210, @F108211, @F108212, @F108213, @F108214, @F108215, @F108216, @F108218, 0);

        -- SCOPE_IDENTITY, not @@IDENTITY: the trigger inserts into delay.Log,
        -- which has an identity of its own.
        SET @TaskID = CAST(SCOPE_IDENTITY() AS BIGINT);

        -- The trigger resolved the name again; the allow-list may have changed
        -- in between.
        SELECT
            @TaskState = t.TaskState,
            @Refusal = t.LastErrorNumber,
            @RefusalMessage = t.LastErrorMessage
        FROM delay.Task AS t
        WHERE t.TaskID = @TaskID;

        IF @TaskState IS NULL OR @TaskState <> N'Scheduled'
        BEGIN
            SET @Msg = CONCAT(N'@F108211: ', ISNULL(@RefusalMessage, N'the task was not scheduled'), N'.');
            SET @Refusal = ISNULL(@Refusal, 50306);
            THROW @Refusal, @Msg, 1;
        END;

        IF @TranCount = 0
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 OR (XACT_STATE() = 1 AND @TranCount = 0)
            ROLLBACK TRANSACTION;
        ELSE IF XACT_STATE() = 1
            ROLLBACK TRANSACTION InitiateDelayExecution;   -- undo only our work
        SET @TaskID = NULL;
        THROW;
    END CATCH;

    SELECT TaskID = @TaskID;
END;
