/*
IX_MailQueue_ClaimByAccount: mailq.ClaimMail's seek, one per (account, run
mode) pair that may send now.  Keys (AccountName, RunMode, Priority DESC,
VisibleAtUtc, ID), INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc), filtered
to Status IN (UnSent, Sending).  Page locks stay allowed (ALTER INDEX ...
REORGANIZE needs them).  Expected plan and cost: docs/dba-guide.md, "Indexes".
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_ClaimByAccount' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount
    ON mailq.MailQueue (AccountName ASC, RunMode ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
    INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc)
    WHERE Status IN (N'UnSent', N'Sending');
