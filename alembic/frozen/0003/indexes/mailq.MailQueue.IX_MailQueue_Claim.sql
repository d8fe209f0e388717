/*
IX_MailQueue_Claim serves mailq.ClaimMail at any queue depth.

Keys (Priority DESC, VisibleAtUtc, ID), filtered to the claimable statuses,
so the index holds only UnSent and Sending rows (a sent backlog of millions
costs it nothing).  ClaimMail's predicate is
    Status IN (N'UnSent', N'Sending')            -- matches the filter
    AND Priority IN (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
    AND VisibleAtUtc <= @Now
    ORDER BY Priority DESC, VisibleAtUtc, ID
Expected plan: Index Seek on IX_MailQueue_Claim with ten seek ranges
(Priority = p AND VisibleAtUtc <= @Now), read in key order, so the rows come
out already in ORDER BY order: no Sort over the backlog; Top (@BatchSize)
stops the seek after the first rows that pass the residual predicates
(account has budget, application); Key Lookup of the clustered index for the
UPDATE; Clustered Index Update.  Logical reads per claim then depend on the
batch size, not on the depth.  The integration suite checks the actual
showplan at 100 k rows (tests/integration/test_mailq_claim_plan.py).

INCLUDE covers the residual predicates (AccountName, AppName) without a
lookup for rows that are skipped.  ALLOW_PAGE_LOCKS = OFF keeps READPAST at
row grain (a page lock would make READPAST skip a whole page of due mail).
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Claim' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailQueue_Claim
    ON mailq.MailQueue (Priority DESC, VisibleAtUtc ASC, ID ASC)
    INCLUDE (AccountName, AppName)
    WHERE Status IN (N'UnSent', N'Sending')
    WITH (ALLOW_PAGE_LOCKS = OFF);
END;
