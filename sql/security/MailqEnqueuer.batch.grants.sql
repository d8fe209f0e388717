/*
Batch enqueue: the procedure and EXECUTE on its table type (needed to pass @MailRows), for
enqueuers and for administrators (`mailq-db enqueue --batch` from an admin login).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqEnqueuer;
GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqEnqueuer;
GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqAdmin;
GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqAdmin;
