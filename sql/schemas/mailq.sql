/*
Schema mailq: every object of the mail queue.  Owned by dbo so that
ownership chaining lets the procedures read and write the tables for callers
that hold only EXECUTE (see sql/security/).
CREATE SCHEMA must be alone in its batch, so it cannot sit under an IF;
Alembic runs this batch once, in revision 0001.
*/
CREATE SCHEMA mailq AUTHORIZATION dbo;
