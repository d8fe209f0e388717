/*
IX_MailQueue_ClaimByApp: mailq.ClaimMail's seek for an isolated worker (@AppName
set), per (account, run mode); ClaimMail repeats the filter's literals.
Plan and why a second index: docs/claim.md.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_ClaimByApp' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByApp
    ON mailq.MailQueue (AccountName ASC, RunMode ASC, AppName ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
    INCLUDE (AttemptsRemaining, ExpiresAtUtc)
    WHERE Status IN (N'UnSent', N'Sending') AND AppName IS NOT NULL;
