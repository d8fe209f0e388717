/*
mailq.SendingAccount: one row per sending account; SMTP host and credentials live
in the worker's configuration.  Per*Limit NULL = unlimited, enforced at claim
across workers (mailq.RateBudget).  BlockedUntilUtc: set by MarkFailed 'Wait'.
IsDefault: EnqueueMail's account when none is named.  MinLoginIntervalMs: least
time between two SMTP logins (mailq.AcquireLoginSlot; LastLoginAtUtc).
*/
IF OBJECT_ID(N'mailq.SendingAccount', N'U') IS NULL
BEGIN
    CREATE TABLE mailq.SendingAccount (
        AccountName NVARCHAR(128) NOT NULL,
        DefaultFromAddress NVARCHAR(320) NOT NULL,
        DefaultFromName NVARCHAR(200) NULL,
        PerMinuteLimit INT NULL,
        PerHourLimit INT NULL,
        PerDayLimit INT NULL,
        BlockedUntilUtc DATETIME2(3) NULL,
        BlockReason NVARCHAR(4000) NULL,
        IsDefault BIT NOT NULL CONSTRAINT DF_SendingAccount_IsDefault DEFAULT (0),
        MinLoginIntervalMs INT NULL,
        LastLoginAtUtc DATETIME2(3) NULL,
        CreatedAtUtc DATETIME2(3) NOT NULL
        CONSTRAINT DF_SendingAccount_CreatedAtUtc DEFAULT (SYSUTCDATETIME()),
        CONSTRAINT PK_SendingAccount PRIMARY KEY CLUSTERED (AccountName),
        CONSTRAINT CK_SendingAccount_Limits CHECK (
            (PerMinuteLimit IS NULL OR PerMinuteLimit > 0)
            AND (PerHourLimit IS NULL OR PerHourLimit > 0)
            AND (PerDayLimit IS NULL OR PerDayLimit > 0)
        ),
        CONSTRAINT CK_SendingAccount_LoginInterval CHECK (
            MinLoginIntervalMs IS NULL OR MinLoginIntervalMs BETWEEN 1 AND 86400000
        )
    );
END;
