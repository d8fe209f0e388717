/*
Grants for per-application hooks (issue 16, point 1; docs/hooks.md):
administrators run the dispatcher (an Agent or elastic job) and read the
hooks.  mailq.SetApplicationHook is for db_owner only (a hook runs as dbo),
so no role is granted it.
*/
GRANT EXECUTE ON OBJECT::mailq.RunApplicationHooks TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ListApplicationHooks TO MailqAdmin;
