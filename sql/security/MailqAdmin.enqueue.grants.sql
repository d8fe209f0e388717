/*
Grants for who may send as whom (docs/enqueue.md): administrators set the
enqueue policy (the procedure also checks db_owner or MailqAdmin itself) and
read it with the unmapped users; sender workers read it for `mailq-db doctor`
(catalog visibility still applies: they see only what they may see).
mailq.EnqueueMailRows, the enqueue core, is granted to no role: EnqueueMail,
EnqueueMailBatch and SendDbMail reach it by ownership chaining.
*/
GRANT EXECUTE ON OBJECT::mailq.SetEnqueuePolicy TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetEnqueuePolicy TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.GetEnqueuePolicy TO MailqSender;
