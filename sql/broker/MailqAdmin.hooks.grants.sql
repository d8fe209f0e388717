/*
Grants for the delayed-execution hook dispatcher (docs/hooks.md):
administrators start, re-time and stop it.  mailq.HookDispatcherTask is run
by delayed execution only (no grant).
*/
GRANT EXECUTE ON OBJECT::mailq.StartHookDispatcher TO MailqAdmin;
