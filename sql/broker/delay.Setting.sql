/*
delay.Setting: the retry and lease policy of dbo.ProcessDelayQueue, one row.
    MaxAttempts        runs of a failing target before it is given up (receipt 3)
    RetryBaseSeconds   backoff before retry n: RetryBaseSeconds * 4^(n-1) ...
    RetryMaxSeconds    ... capped at RetryMaxSeconds
    LeaseSeconds       watchdog: if a run has not reported after this long, the
                       activation procedure checks whether its runner is alive
                       (slow: the lease is extended and logged) or gone
                       (the attempt failed: retried or given up)
    ReceiveWaitMs      how long an idle reader waits in WAITFOR (RECEIVE) before
                       it exits (activation starts readers again on demand)
    TargetLockTimeoutMs  NULL (wait for locks as long as it takes) or the
                       SET LOCK_TIMEOUT, in ms, under which targets run (error
                       1222 then fails the attempt, which is retried)
Operators change it with UPDATE (db_owner); the procedures read it at each message.
*/
IF OBJECT_ID(N'delay.Setting', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Setting (
        SettingId TINYINT NOT NULL CONSTRAINT DF_Setting_SettingId DEFAULT (1),
        MaxAttempts INT NOT NULL CONSTRAINT DF_Setting_MaxAttempts DEFAULT (3),
        RetryBaseSeconds INT NOT NULL CONSTRAINT DF_Setting_RetryBaseSeconds DEFAULT (30),
        RetryMaxSeconds INT NOT NULL CONSTRAINT DF_Setting_RetryMaxSeconds DEFAULT (3600),
        LeaseSeconds INT NOT NULL CONSTRAINT DF_Setting_LeaseSeconds DEFAULT (600),
        ReceiveWaitMs INT NOT NULL CONSTRAINT DF_Setting_ReceiveWaitMs DEFAULT (5000),
        TargetLockTimeoutMs INT NULL,
        CONSTRAINT PK_Setting PRIMARY KEY CLUSTERED (SettingId),
        CONSTRAINT CK_Setting_SingleRow CHECK (SettingId = 1),
        CONSTRAINT CK_Setting_MaxAttempts CHECK (MaxAttempts BETWEEN 1 AND 100),
        CONSTRAINT CK_Setting_RetryBaseSeconds CHECK (RetryBaseSeconds BETWEEN 1 AND 86400),
        CONSTRAINT CK_Setting_RetryMaxSeconds CHECK (RetryMaxSeconds BETWEEN 1 AND 86400),
        CONSTRAINT CK_Setting_LeaseSeconds CHECK (LeaseSeconds BETWEEN 1 AND 86400),
        CONSTRAINT CK_Setting_ReceiveWaitMs CHECK (ReceiveWaitMs BETWEEN 100 AND 60000),
        CONSTRAINT CK_Setting_TargetLockTimeoutMs CHECK (TargetLockTimeoutMs BETWEEN 0 AND 3600000)
    );

    INSERT INTO delay.Setting (SettingId) VALUES (1);
END;
