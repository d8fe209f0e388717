/*
mailq.GetEventStreamStall for readers of the event stream; it reads the transaction
DMVs with the caller's rights (VIEW SERVER STATE, or VIEW DATABASE STATE on Azure).
*/
GRANT EXECUTE ON OBJECT::mailq.GetEventStreamStall TO MailqEnqueuer;
GRANT EXECUTE ON OBJECT::mailq.GetEventStreamStall TO MailqAdmin;
