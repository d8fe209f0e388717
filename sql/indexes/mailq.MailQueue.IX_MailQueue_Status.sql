/*
IX_MailQueue_Status: the narrow index the counts read (issue 10, point 8).
Keys (Status, AccountName, VisibleAtUtc), no INCLUDE, unfiltered: about 40
bytes per mail against a clustered row that carries the addresses, subject
and (until mailq.MoveBodiesOutOfRow ran) the bodies.
  mailq.QueueCountsByStatus  Index Scan of this index in key order + Stream
                             Aggregate: no Sort, no Key Lookup, never the
                             clustered index.
  mailq.OldestDueMail        Index Seek (Status = 'UnSent', residual
                             VisibleAtUtc <= now) + Stream Aggregate per account.
Unfiltered on purpose: a view's Status predicate then never has to match an
index filter (a filtered index is used only when the query's predicate
provably implies the filter, which a parameterized or forced-parameterized
statement cannot show).  Cost: one more key per mail, rewritten when the
status changes.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'IX_MailQueue_Status' AND object_id = OBJECT_ID(N'mailq.MailQueue')
)
BEGIN
    CREATE NONCLUSTERED INDEX IX_MailQueue_Status
    ON mailq.MailQueue (Status ASC, AccountName ASC, VisibleAtUtc ASC);
END;
