/*
Schema mailq: every object of the mail queue.  Owned by dbo, so ownership
chaining lets the procedures use the tables for callers that hold only
EXECUTE (sql/security/).  Sent as IF SCHEMA_ID(...) IS NULL EXEC (...).
*/
CREATE SCHEMA mailq AUTHORIZATION dbo;
