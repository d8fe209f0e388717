/*
mailq.HookDispatcher: the one row that keeps the self-re-arming hook
dispatcher of delayed execution (docs/hooks.md, "With delayed execution").
Deployed with delayed execution only (sql/broker/: `-x broker=off` leaves it
out; on Azure SQL Database an Agent or elastic job runs
mailq.RunApplicationHooks instead).

Enabled          1 while mailq.StartHookDispatcher has started it and not
                 stopped it.
IntervalSeconds  the delay between two runs (1-3600).
Generation       the chain's current link: each run of
                 mailq.HookDispatcherTask carries the generation it was
                 scheduled for (@Param1) and re-arms only if that is still
                 the current one; a stopped, restarted or redelivered run is
                 stale and does nothing.  With InstanceKey it forms the
                 idempotency key of the next task, so a re-arm repeated for
                 the same generation returns the same task: at most one
                 pending dispatcher task.
InstanceKey      random per installation of this table, so keys of an earlier
                 installation (delay.Task keeps them) are never reused.
TaskID           the task of the current generation (delay.Task.TaskID).
*/
IF OBJECT_ID(N'mailq.HookDispatcher', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.HookDispatcher (
        Singleton TINYINT NOT NULL
        CONSTRAINT DF_HookDispatcher_Singleton DEFAULT (1),
        Enabled BIT NOT NULL,
        IntervalSeconds INT NOT NULL,
        Generation BIGINT NOT NULL,
        InstanceKey UNIQUEIDENTIFIER NOT NULL
        CONSTRAINT DF_HookDispatcher_InstanceKey DEFAULT (NEWID()),
        TaskID BIGINT NULL,
        LastRunAtUtc DATETIME2(3) NULL,
        LastError NVARCHAR(4000) NULL,
        ChangedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_HookDispatcher_ChangedAtUtc DEFAULT (SYSUTCDATETIME()),
        ChangedBy NVARCHAR(128) NOT NULL
        CONSTRAINT DF_HookDispatcher_ChangedBy DEFAULT (ORIGINAL_LOGIN()),
        CONSTRAINT PK_HookDispatcher PRIMARY KEY CLUSTERED (Singleton),
        CONSTRAINT CK_HookDispatcher_Singleton CHECK (Singleton = 1),
        CONSTRAINT CK_HookDispatcher_IntervalSeconds CHECK (IntervalSeconds BETWEEN 1 AND 3600)
    );
END;
