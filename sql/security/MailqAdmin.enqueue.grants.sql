/*
Who may send as whom (docs/enqueue.md): administrators set and read the enqueue
policy; workers read it for `mailq-db doctor`.  mailq.EnqueueMailRows is granted to
no role (reached by ownership chaining).
*/
GRANT EXECUTE ON OBJECT::mailq.SetEnqueuePolicy TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetEnqueuePolicy TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetEnqueuePolicy TO MailqSender;
