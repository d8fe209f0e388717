/*
IX_MailQueue_ClaimByAccount: mailq.ClaimMail's seek per (account, run mode); page
locks stay allowed (REORGANIZE needs them).  Plan and cost: docs/dba-guide.md.
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
