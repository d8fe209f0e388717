/*
mailq.HookDispatcher: the hook dispatcher of delayed execution (docs/hooks.md), one
row: when Enabled, a reader runs mailq.RunApplicationHooks once NextRunAtUtc has
come (delay.RunDueTasks) and moves it IntervalSeconds on; the dispatcher's
timer wakes for it too.  Deployed with delayed execution only; without it
(`-x broker=off`) an Agent or elastic job runs mailq.RunApplicationHooks.
*/
IF OBJECT_ID(N'mailq.HookDispatcher', N'U') IS NULL
    CREATE TABLE mailq.HookDispatcher (
        Singleton TINYINT NOT NULL CONSTRAINT DF_HookDispatcher_Singleton DEFAULT (1),
        Enabled BIT NOT NULL,
        IntervalSeconds INT NOT NULL,
        NextRunAtUtc DATETIME2(3) NOT NULL,
        LastRunAtUtc DATETIME2(3) NULL,
        LastError NVARCHAR(4000) NULL,
        ChangedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_HookDispatcher_ChangedAtUtc DEFAULT (SYSUTCDATETIME()),
        ChangedBy NVARCHAR(128) NOT NULL CONSTRAINT DF_HookDispatcher_ChangedBy DEFAULT (ORIGINAL_LOGIN()),
        CONSTRAINT PK_HookDispatcher PRIMARY KEY CLUSTERED (Singleton),
        CONSTRAINT CK_HookDispatcher_Singleton CHECK (Singleton = 1),
        CONSTRAINT CK_HookDispatcher_IntervalSeconds CHECK (IntervalSeconds BETWEEN 1 AND 3600)
    );
