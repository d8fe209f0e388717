/*
delay.Dispatcher: the one dispatcher conversation and its timer, one row.
ConversationHandle: the initiator handle of the self-dialog whose conversation timer
wakes activation (delay.ArmDispatcher begins a new one when it is lost).
ArmedForUtc: when the timer fires, as the last reader set it: an upper bound (an
inserter only moves the timer earlier), which inserters read to decide whether to.
LastArmedAtUtc, LastWokenAtUtc: the readers' heartbeat (delay.Monitor).
BrokerGuid: the broker identity this database runs tasks for (recorded by the first
reader); a copy (another identity) runs nothing until delay.EnableThisDatabase there.
*/
IF OBJECT_ID(N'delay.Dispatcher', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Dispatcher (
        DispatcherId TINYINT NOT NULL CONSTRAINT DF_Dispatcher_DispatcherId DEFAULT (1),
        ConversationHandle UNIQUEIDENTIFIER NULL,
        ArmedForUtc DATETIME2(3) NULL,
        LastArmedAtUtc DATETIME2(3) NULL,
        LastWokenAtUtc DATETIME2(3) NULL,
        BrokerGuid UNIQUEIDENTIFIER NULL,
        EnabledAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Dispatcher_EnabledAtUtc DEFAULT (SYSUTCDATETIME()),
        EnabledBy NVARCHAR(128) NOT NULL CONSTRAINT DF_Dispatcher_EnabledBy DEFAULT (ORIGINAL_LOGIN()),
        CONSTRAINT PK_Dispatcher PRIMARY KEY CLUSTERED (DispatcherId),
        CONSTRAINT CK_Dispatcher_SingleRow CHECK (DispatcherId = 1)
    );
    INSERT INTO delay.Dispatcher (DispatcherId) VALUES (1);
END;
