/*
Grants of role MailqEnqueuer for batch enqueue (revision 0014): the procedure,
and EXECUTE on its table type, which a caller needs to declare a variable of
the type and pass it as @MailRows.  Revision 0016 re-creates both (the type
gained the template columns), which drops their permissions: this file runs
again in that revision and grants them again.
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqEnqueuer;
GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqEnqueuer;
