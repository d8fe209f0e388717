/*
IX_MailQueue_ClaimByAccount serves mailq.ClaimMail: one seek per sending
account that may send now, whatever else is queued.

Keys (AccountName, Priority DESC, VisibleAtUtc, ID), filtered to the
claimable statuses (UnSent, Sending), so a sent backlog of millions costs it
nothing.  ClaimMail drives the claim from the accounts that have budget left,
are not blocked and that the worker serves (@AccountNames), and reads each
of them through CROSS APPLY:
    SELECT TOP (cap) ... WITH (INDEX (IX_MailQueue_ClaimByAccount), FORCESEEK,
                               READPAST, UPDLOCK, ROWLOCK)
    WHERE AccountName = a.AccountName
      AND Status IN (N'UnSent', N'Sending')          -- implies the filter
      AND Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
      AND VisibleAtUtc <= @Now
    ORDER BY Priority DESC, VisibleAtUtc, ID
Expected plan: Nested Loops (outer: the table variable of accounts, one row
per account with budget) over Top (cap) <- Sequence Project <- Index Seek on
this index with ten seek ranges per account (AccountName = a AND Priority = p
AND VisibleAtUtc <= @Now), read in key order: rows come out in ORDER BY order,
no Sort below the Top, and the Top stops each seek after `cap` rows.  Above
the apply: a TopN Sort of at most max(batch, accounts) rows (the fair share,
see ClaimMail), a Clustered Index Seek by ID for the UPDATE.  Rows of an
account that is out of budget, blocked or not served are never read: its
key range is never sought.  Logical reads per claim are
    accounts with budget x (index depth + 10 ranges) + rows claimed,
and key locks per statement at most 2 x @BatchSize on this index (the rows
read, and the new key of each row claimed; far below
the 5,000 locks per statement and index at which SQL Server escalates; see
"Lock escalation" in Microsoft's reference: the threshold counts locks one
statement takes on one index or table).

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
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_ClaimByAccount' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    IF CAST(SERVERPROPERTY('EngineEdition') AS INT) IN (3, 5, 8)
        CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount
        ON mailq.MailQueue (AccountName ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
        INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc)
        WHERE Status IN (N'UnSent', N'Sending')
        WITH (ONLINE = ON);
    ELSE
        CREATE NONCLUSTERED INDEX IX_MailQueue_ClaimByAccount
        ON mailq.MailQueue (AccountName ASC, Priority DESC, VisibleAtUtc ASC, ID ASC)
        INCLUDE (AppName, AttemptsRemaining, ExpiresAtUtc)
        WHERE Status IN (N'UnSent', N'Sending');
END;
