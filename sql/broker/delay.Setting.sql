/*
delay.Setting: the dispatcher's policy, one row (db_owner changes it with UPDATE;
each pass reads it).  MaxAttempts runs of a failing target before receipt 3;
RetryBaseSeconds * 4^(n-1), at most RetryMaxSeconds, before retry n; LeaseSeconds a
claim's lease (a claimed task not started by then is claimed again; a running one
never is); BatchSize tasks per claim; TickSeconds the safety tick (the timer never
waits longer); ReceiveWaitMs an idle reader's wait before it exits;
TargetLockTimeoutMs every target's SET LOCK_TIMEOUT (finite: 1222 fails the attempt);
OverdueSeconds when a due task counts as overdue; RetentionDays for delay.PurgeHistory.
*/
IF OBJECT_ID(N'delay.Setting', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Setting (
        SettingId TINYINT NOT NULL CONSTRAINT DF_Setting_SettingId DEFAULT (1),
        MaxAttempts INT NOT NULL CONSTRAINT DF_Setting_MaxAttempts DEFAULT (3),
        RetryBaseSeconds INT NOT NULL CONSTRAINT DF_Setting_RetryBaseSeconds DEFAULT (30),
        RetryMaxSeconds INT NOT NULL CONSTRAINT DF_Setting_RetryMaxSeconds DEFAULT (3600),
        LeaseSeconds INT NOT NULL CONSTRAINT DF_Setting_LeaseSeconds DEFAULT (30),
        BatchSize INT NOT NULL CONSTRAINT DF_Setting_BatchSize DEFAULT (50),
        TickSeconds INT NOT NULL CONSTRAINT DF_Setting_TickSeconds DEFAULT (60),
        ReceiveWaitMs INT NOT NULL CONSTRAINT DF_Setting_ReceiveWaitMs DEFAULT (5000),
        TargetLockTimeoutMs INT NOT NULL CONSTRAINT DF_Setting_TargetLockTimeoutMs DEFAULT (30000),
        OverdueSeconds INT NOT NULL CONSTRAINT DF_Setting_OverdueSeconds DEFAULT (60),
        RetentionDays INT NOT NULL CONSTRAINT DF_Setting_RetentionDays DEFAULT (30),
        CONSTRAINT PK_Setting PRIMARY KEY CLUSTERED (SettingId),
        CONSTRAINT CK_Setting_Values CHECK (
            SettingId = 1 AND MaxAttempts BETWEEN 1 AND 100 AND RetryBaseSeconds BETWEEN 1 AND 86400
            AND RetryMaxSeconds BETWEEN 1 AND 86400 AND LeaseSeconds BETWEEN 5 AND 86400
            AND BatchSize BETWEEN 1 AND 1000
            AND TickSeconds BETWEEN 1 AND 86400 AND ReceiveWaitMs BETWEEN 100 AND 60000
            AND TargetLockTimeoutMs BETWEEN 1 AND 3600000 AND OverdueSeconds BETWEEN 1 AND 86400
            AND RetentionDays BETWEEN 1 AND 3650
        )
    );
    INSERT INTO delay.Setting (SettingId) VALUES (1);
END;
