/*
IX_MailQueue_ClaimByAccount serves mailq.ClaimMail: one seek per (sending
account, run mode) pair that may send now, whatever else is queued.

Keys (AccountName, RunMode, Priority DESC, VisibleAtUtc, ID), filtered to the
claimable statuses (UnSent, Sending), so a sent backlog of millions costs it
nothing.  ClaimMail drives the claim from the accounts that have budget left,
are not blocked and that the worker serves (@AccountNames), crossed with the
run modes the worker serves (@RunModes, revision 0015), and reads each such
pair through CROSS APPLY:
    SELECT TOP (cap) ... WITH (INDEX (IX_MailQueue_ClaimByAccount), FORCESEEK,
                               READPAST, UPDLOCK, ROWLOCK)
    WHERE AccountName = d.AccountName
      AND RunMode = d.RunMode
      AND Status IN (N'UnSent', N'Sending')          -- implies the filter
      AND Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
      AND VisibleAtUtc <= @Now
    ORDER BY Priority DESC, VisibleAtUtc, ID
Expected plan: Nested Loops (outer: the table variable of pairs, one row per
(account with budget, run mode served)) over Top (cap) <- Sequence Project <-
Index Seek on this index with ten seek ranges per pair (AccountName = a AND
RunMode = m AND Priority = p AND VisibleAtUtc <= @Now), read in key order:
rows come out in ORDER BY order, no Sort below the Top, and the Top stops
each seek after `cap` rows.  Above the apply: a TopN Sort of at most
max(batch, pairs) rows (the fair share, see ClaimMail), a Clustered Index
Seek by ID for the UPDATE.  Rows of an account that is out of budget,
blocked or not served, and rows of a run mode the worker does not serve, are
never read: their key ranges are never sought (RunMode is an equality key
right after AccountName, so the mail of other run modes lies outside every
range sought).  Logical reads per claim are
    pairs with budget x (index depth + 10 ranges) + rows claimed,
pairs = accounts with budget x run modes served (at most @BatchSize pairs
are claimed from: ClaimMail draws them; with more pairs than @BatchSize each
pair is first probed once by a row-free EXISTS on this index, depth + at
most 10 ranges, so that cost is bounded by accounts x run modes served, not
by @BatchSize), and key locks per statement at most
2 x @BatchSize on this index (the rows read, and the new key of each row
claimed; far below the 5,000 locks per statement and index at which SQL
Server escalates; see "Lock escalation" in Microsoft's reference: the
threshold counts locks one statement takes on one index or table).

INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc) covers ClaimMail's
residual predicates (application filter, attempts left, not expired) without
a lookup.  Rows that fail them are read past until mailq.FinalizeMail (or the
application's own worker) moves them: expired and out-of-attempts mail is
finalized in bounded batches on a timer, so that cost stays small.

ALLOW_PAGE_LOCKS stays ON (the default; IX_MailQueue_Claim had it OFF):
ClaimMail's ROWLOCK hint already keeps READPAST at row grain, and with page
locks disallowed ALTER INDEX ... REORGANIZE fails, which breaks the index
maintenance DBAs run (e.g. Ola Hallengren's IndexOptimize).

ONLINE = ON where the edition supports online index operations (Enterprise,
Developer, Evaluation; Azure SQL Database and Managed Instance: engine
editions 3, 5, 8), so that building it on a deployed queue does not block
enqueues and claims; other editions build it offline (Standard refuses
ONLINE = ON with error 1712 when the statement runs, so the branch not taken
is harmless).  The filter and INCLUDE columns hold no LOB, which online
builds of nonclustered indexes require.

Revision 0015 added RunMode to the keys; a deployed queue gets it through
sql/upgrades/mailq.0015.MailQueue.sql (CREATE INDEX ... WITH (DROP_EXISTING
= ON, ONLINE = ON where the edition allows)); this file shows the current
shape and creates it where it does not exist.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_ClaimByAccount' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    IF CAST(SERVERPROPERTY('EngineEdition') AS INT) IN (3, 5, 8)
        CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount
        ON mailq.MailQueue (AccountName ASC, RunMode ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
        INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc)
        WHERE Status IN (N'UnSent', N'Sending')
        WITH (ONLINE = ON);
    ELSE
        CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount
        ON mailq.MailQueue (AccountName ASC, RunMode ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
        INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc)
        WHERE Status IN (N'UnSent', N'Sending');
END;
