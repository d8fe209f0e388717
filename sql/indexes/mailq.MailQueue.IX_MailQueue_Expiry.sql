/*
IX_MailQueue_Expiry serves mailq.FinalizeMail's second statement: queued
mails whose ExpiresAtUtc passed become Expired, whatever their account (also
accounts that are blocked or that no worker serves).

Keys (ExpiresAtUtc, ID), INCLUDE (VisibleAtUtc), filtered to
Status IN (UnSent, Sending) AND ExpiresAtUtc IS NOT NULL: only queued mail
that has an expiry.  Expected plan: Index Seek (ExpiresAtUtc <= @Now),
residual "UnSent, or Sending with an expired lease" (a live lease is left to
its worker), Top (@BatchSize), Clustered Index Seek for the UPDATE.
ONLINE = ON where the edition allows it (see IX_MailQueue_ClaimByAccount).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Expiry' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    IF CAST(SERVERPROPERTY('EngineEdition') AS INT) IN (3, 5, 8)
        CREATE NONCLUSTERED INDEX IX_MailQueue_Expiry
        ON mailq.MailQueue (ExpiresAtUtc ASC, ID ASC)
        INCLUDE (VisibleAtUtc)
        WHERE Status IN (N'UnSent', N'Sending') AND ExpiresAtUtc IS NOT NULL
        WITH (ONLINE = ON);
    ELSE
        CREATE NONCLUSTERED INDEX IX_MailQueue_Expiry
        ON mailq.MailQueue (ExpiresAtUtc ASC, ID ASC)
        INCLUDE (VisibleAtUtc)
        WHERE Status IN (N'UnSent', N'Sending') AND ExpiresAtUtc IS NOT NULL;
END;
