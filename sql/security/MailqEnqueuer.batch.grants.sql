/*
Batch enqueue: the procedure, and EXECUTE on its table type (a caller needs it
to declare a variable of the type and pass it as @MailRows).  Dropping a type
or procedure drops its grants: a revision that re-creates either carries this
file again.
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqEnqueuer;
GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqEnqueuer;
