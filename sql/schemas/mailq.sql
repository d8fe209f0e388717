/*
Schema mailq: every object of the mail queue, owned by dbo (ownership chaining:
callers hold only EXECUTE).  Sent as IF SCHEMA_ID(...) IS NULL EXEC (...).
*/
CREATE SCHEMA mailq AUTHORIZATION dbo;
