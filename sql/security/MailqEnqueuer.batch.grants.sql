/*
Batch enqueue: the procedure and EXECUTE on its table type (needed to pass @MailRows).
*/
GRANT EXECUTE ON OBJECT::mailq.EnqueueMailBatch TO MailqEnqueuer;
GRANT EXECUTE ON TYPE::mailq.MailBatchRow TO MailqEnqueuer;
