/*
IX_MailQueue_Claim (keys Priority DESC, VisibleAtUtc, ID) served the claim
up to revision 0004.  Its seek read, and U-locked, every due row ranked
ahead of the claimable ones (accounts out of budget, blocked, not served,
other applications), so a claim's cost grew with the backlog that could not
be sent (issue 10, point 1).  Revision 0005 replaces it with
IX_MailQueue_ClaimByAccount (created just before this file runs) and drops
it here.  No claim ever runs without an index: a revision is one transaction
(alembic/env.py, transaction_per_migration), and DROP INDEX holds its
schema-modification lock on mailq.MailQueue until that transaction commits,
together with the new mailq.ClaimMail, which never names the old index.
mailq.OldestDueMail (Status = N'UnSent') is served by the new index, whose
filter its predicate implies.  Downgrading 0005 re-creates the old index from
revision 0003's copy.
*/
IF EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Claim' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
    DROP INDEX IX_MailQueue_Claim ON mailq.MailQueue;
