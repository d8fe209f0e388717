/*
Hooks (docs/hooks.md): administrators run the dispatcher and list the hooks;
mailq.SetApplicationHook is db_owner's.
*/
GRANT EXECUTE ON OBJECT::mailq.RunApplicationHooks TO MailqAdmin;
GRANT EXECUTE ON OBJECT::mailq.ListApplicationHooks TO MailqAdmin;
