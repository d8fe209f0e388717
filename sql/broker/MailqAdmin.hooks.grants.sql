/*
Grants for the hook dispatcher of delayed execution (docs/hooks.md):
administrators start, re-time and stop it.
*/
GRANT EXECUTE ON OBJECT::mailq.StartHookDispatcher TO MailqAdmin;
