/*
delay.Incident: messages that dbo.ProcessDelayQueue could not process, written
by its recovery transaction (the one that RECEIVEs the message a second time,
after step 1 failed and rolled back).
Deliberately plain: no CHECK, no foreign key, no trigger, no default that can
fail, and nothing the platform owns, so that the INSERT of the recovery cannot
fail for the reason step 1 failed.  A failure to write here is the second
rollback of that message; the reader then stops and writes the error log.
    ConversationHandle  the conversation the message arrived on (ended by the recovery)
    MessageType         its message_type_name
    TaskID              the task step 1 was working on, if known
    ErrorNumber / ErrorMessage  the error of step 1
Read it with: SELECT IncidentId, RecordedAtUtc, TaskID, ErrorNumber, ErrorMessage
              FROM delay.Incident ORDER BY IncidentId DESC;
*/
IF OBJECT_ID(N'delay.Incident', N'U') IS NULL
BEGIN
    CREATE TABLE delay.Incident (
        IncidentId BIGINT IDENTITY (1, 1) NOT NULL,
        RecordedAtUtc DATETIME2(3) NOT NULL CONSTRAINT DF_Incident_RecordedAtUtc DEFAULT (SYSUTCDATETIME()),
        ConversationHandle UNIQUEIDENTIFIER NULL,
        MessageType NVARCHAR(256) NULL,
        TaskID BIGINT NULL,
        ErrorNumber INT NULL,
        ErrorMessage NVARCHAR(4000) NULL,
        CONSTRAINT PK_Incident PRIMARY KEY CLUSTERED (IncidentId)
    );
END;
