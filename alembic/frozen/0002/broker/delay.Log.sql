/*
delay.Log: refusals and failures of delayed execution, one row per event.
    EventName   Refused     the row was never scheduled or never run (ErrorNumber
                            50302-50307 says why); receipt 2
                Failed      a run failed and will be retried (Attempt = the run)
                GaveUp      the last failure: receipt 3
                Slow        a run outlived its lease; the runner is alive, the
                            lease was extended (the run is not interrupted)
                RunnerLost  the session running a target ended without reporting
                            (ErrorNumber 50331); counted as a failed attempt
                Cancelled   cancelled by dbo.CancelDelayExecution, or the
                            platform row was deleted before the run (50332)
                BrokerError an Error message arrived on a task's conversation,
                            or the activation procedure itself failed
    ErrorNumber / ErrorMessage: ERROR_NUMBER() and ERROR_MESSAGE() of the
    failure, or the 503xx number of docs/errors.md.
*/
IF OBJECT_ID(N'delay.Log', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Log (
        LogId BIGINT IDENTITY (1, 1) NOT NULL,
        LoggedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Log_LoggedAtUtc DEFAULT (SYSUTCDATETIME()),
        TaskID BIGINT NULL,
        EventName NVARCHAR(16) NOT NULL,
        TargetName NVARCHAR(400) NULL,
        Attempt INT NULL,
        ErrorNumber INT NULL,
        ErrorMessage NVARCHAR(4000) NULL,
        ConversationHandle UNIQUEIDENTIFIER NULL,
        CONSTRAINT PK_Log PRIMARY KEY CLUSTERED (LogId),
        CONSTRAINT CK_Log_EventName CHECK (
            EventName IN (N'Refused', N'Failed', N'GaveUp', N'Slow', N'RunnerLost', N'Cancelled', N'BrokerError')
        )
    );
END;
