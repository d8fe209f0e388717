/*
IX_MailQueue_Finalize serves mailq.FinalizeMail's first statement: mails
that have no attempt left and whose lease expired (the worker holding the
last attempt died or stalled) become Failed.

Keys (VisibleAtUtc, ID), filtered to Status IN (UnSent, Sending) AND
AttemptsRemaining = 0: the index holds only mails on their last attempt
(at most the mails in flight, plus the dead ones waiting for finalization).
Expected plan: Index Seek (VisibleAtUtc <= @Now), Top (@BatchSize), Clustered
Index Seek for the UPDATE; reads and locks proportional to @BatchSize.
ONLINE = ON where the edition allows it (see IX_MailQueue_ClaimByAccount).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Finalize' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    IF CAST(SERVERPROPERTY('EngineEdition') AS INT) IN (3, 5, 8)
        CREATE NONCLUSTERED INDEX IX_MailQueue_Finalize
        ON mailq.MailQueue (VisibleAtUtc ASC, ID ASC)
        WHERE Status IN (N'UnSent', N'Sending') AND AttemptsRemaining = 0
        WITH (ONLINE = ON);
    ELSE
        CREATE NONCLUSTERED INDEX IX_MailQueue_Finalize
        ON mailq.MailQueue (VisibleAtUtc ASC, ID ASC)
        WHERE Status IN (N'UnSent', N'Sending') AND AttemptsRemaining = 0;
END;
