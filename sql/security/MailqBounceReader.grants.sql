/*
Grants for bounces, complaints, unsubscribes and suppression (docs/bounces.md):
the bounce reader role records; administrators also list, add, remove,
purge and read the views.  mailq.ApplySuppressions and mailq.CheckBounceReport
are internal (reached through ownership chaining only) and granted to nobody; enqueuers need no
grant for mailq.FilterSuppressedRecipients, which the enqueue core
(mailq.EnqueueMailRows) calls.
*/
GRANT EXECUTE ON OBJECT::mailq.RecordBounce TO MailqBounceReader;
GRANT EXECUTE ON OBJECT::mailq.RecordUnsubscribe TO MailqBounceReader;
GRANT EXECUTE ON OBJECT::mailq.RecordBounce TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RecordUnsubscribe TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.AddSuppression TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.RemoveSuppression TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ListSuppressions TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetSuppressionStats TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.PurgeBounceReports TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.Suppressions TO MailqAdmin;
GRANT SELECT ON OBJECT::mailq.RecentBounceReports TO MailqAdmin;
