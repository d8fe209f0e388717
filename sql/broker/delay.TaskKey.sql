/*
delay.TaskKey: dbo.InitiateDelayExecution's idempotency keys, one per task.  A
binary collation: keys compare as sent (with SQL Server's trailing-blank padding,
which the procedure's key lock follows by hashing RTRIM of the key).  A table of
its own: delay.Task keeps no filtered index, which would make the platform's
INSERT depend on its session's SET options.
*/
IF OBJECT_ID(N'delay.TaskKey', N'U') IS NULL
    CREATE TABLE delay.TaskKey (
        IdempotencyKey NVARCHAR(100) COLLATE Latin1_General_100_BIN2 NOT NULL,
        TaskID BIGINT NOT NULL,
        CONSTRAINT PK_TaskKey PRIMARY KEY CLUSTERED (IdempotencyKey)
    );
