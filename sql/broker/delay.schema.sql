/*
Schema delay: the internal objects of delayed execution.  The public contract
stays in dbo, as the source document names it.  Owned by dbo, so that ownership
chaining lets the dbo procedures and the trigger reach these tables for callers
that hold only EXECUTE.  CREATE SCHEMA is alone in its batch; the deployment guards it.
*/
CREATE SCHEMA delay AUTHORIZATION dbo;
