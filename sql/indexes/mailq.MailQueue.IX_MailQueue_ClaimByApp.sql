/*
IX_MailQueue_ClaimByApp serves the claim of an isolated worker
(mailq.ClaimMail @AppName = N'...'): one seek per (sending account, run
mode) pair that reads that application's mail only.
Keys (AccountName, RunMode, AppName, Priority DESC, VisibleAtUtc, ID),
INCLUDE (AttemptsRemaining, ExpiresAtUtc), filtered to the claimable
statuses of mail that has an application.  ClaimMail reads it WITH (INDEX
(IX_MailQueue_ClaimByApp), FORCESEEK, READPAST, UPDLOCK, ROWLOCK) and
repeats the filter's literals (Status IN (N'UnSent', N'Sending') AND AppName
IS NOT NULL), so the filtered index always matches.
Expected plan: Nested Loops over the pairs, per pair Top (cap) <- Index Seek
with ten ranges (AccountName = a, RunMode = m, AppName = @AppName, Priority
= p, VisibleAtUtc <= @Now), in key order: no Sort below the Top, residual
AttemptsRemaining and ExpiresAtUtc only.  Rows of other applications lie
outside every range sought, so the reads of a claim are those of its batch
whatever other applications have queued on the same accounts.
Why a second index (docs/claim.md): AppName as the third key of
IX_MailQueue_ClaimByAccount would break the single ordered seek per pair of
competing workers (priority order across applications would need a Sort).
Cost: one more index row rewritten when a mail with an application is
enqueued, claimed or finished.  ONLINE = ON where the edition allows it
(engine editions 3, 5, 8; see IX_MailQueue_ClaimByAccount).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_ClaimByApp' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    IF CAST(SERVERPROPERTY('EngineEdition') AS INT) IN (3, 5, 8)
        CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByApp
        ON mailq.MailQueue (AccountName ASC, RunMode ASC, AppName ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
        INCLUDE (AttemptsRemaining, ExpiresAtUtc)
        WHERE Status IN (N'UnSent', N'Sending') AND AppName IS NOT NULL
        WITH (ONLINE = ON);
    ELSE
        CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByApp
        ON mailq.MailQueue (AccountName ASC, RunMode ASC, AppName ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
        INCLUDE (AttemptsRemaining, ExpiresAtUtc)
        WHERE Status IN (N'UnSent', N'Sending') AND AppName IS NOT NULL;
END;
