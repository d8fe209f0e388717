/*
User MailqRunner: the one identity registered code runs as: every
delayed-execution target (delay.RunTask) and every hook (mailq.RunApplicationHooks)
is called inside EXECUTE AS USER = N'MailqRunner' ... REVERT, never as dbo.
WITHOUT LOGIN: nobody can connect as it; only dbo (and db_owner members)
may impersonate it.  It holds EXECUTE on exactly the listed targets and the
registered hooks (granted by delay.AllowProcedure and mailq.SetApplicationHook,
revoked when they are taken off) and nothing else: what a target or hook reaches
beyond that is by ownership chaining from a dbo-owned module, and DDL, permission
changes or impersonation inside it (a callee's, a trigger's) run with these rights.
Part of the mail queue (hooks deploy without Service Broker too).
*/
IF DATABASE_PRINCIPAL_ID(N'MailqRunner') IS NULL
    CREATE USER MailqRunner WITHOUT LOGIN;
