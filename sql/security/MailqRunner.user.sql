/*
User MailqRunner (WITHOUT LOGIN; only dbo and db_owner may impersonate it): the
identity every delayed-execution target (delay.RunTask) and hook
(mailq.RunApplicationHooks) runs as, EXECUTE AS USER ... REVERT, never as dbo.
It holds EXECUTE on exactly the allowed targets and registered hooks (granted by
delay.AllowProcedure and mailq.SetApplicationHook) and nothing else.
*/
IF DATABASE_PRINCIPAL_ID(N'MailqRunner') IS NULL
    CREATE USER MailqRunner WITHOUT LOGIN;
