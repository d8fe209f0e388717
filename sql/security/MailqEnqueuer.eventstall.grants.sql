/*
Grants on mailq.GetEventStreamStall: whoever reads the event stream
(MailqEnqueuer, MailqAdmin) may ask what holds it back.  The procedure reads
the transaction DMVs with the caller's own rights, so the grant shows open
transactions only to a caller who already holds VIEW SERVER STATE (or VIEW
DATABASE STATE on Azure SQL Database).
*/
GRANT EXECUTE ON OBJECT::mailq.GetEventStreamStall TO MailqEnqueuer;
GRANT EXECUTE ON OBJECT::mailq.GetEventStreamStall TO MailqAdmin;
