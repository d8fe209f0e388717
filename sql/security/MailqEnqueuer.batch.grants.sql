/*
Grants of role MailqEnqueuer for batch enqueue (revision 0014): the procedure,
and EXECUTE on its table type, which a caller needs to declare a variable of
the type and pass it as @MailRows.
Revisions 0015 (the type gained RunMode) and 0016 (the template columns)
re-create the type, and 0016 the procedure too: a table type cannot be
altered, and dropping a type or procedure drops its permissions, so this
file runs again in both revisions and grants them again.
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqEnqueuer;
GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqEnqueuer;
