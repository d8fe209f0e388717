/*
Grants of role MailqEnqueuer for batch enqueue (revision 0014): the procedure,
and EXECUTE on its table type, which a caller needs to declare a variable of
the type and pass it as @MailRows.
Revision 0015 re-creates the type (a column RunMode; a table type cannot be
altered) and re-runs these grants: dropping a type drops its permissions.
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqEnqueuer;
GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqEnqueuer;
