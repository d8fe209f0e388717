/*
Role MailqBounceReader: the bounce reader (`mailq-db bounces`) and the
one-click unsubscribe endpoint (`mailq-db unsubscribe-server`): record
bounces, complaints and unsubscribes, nothing else.  Not MailqSender: these
processes read mail written by strangers and answer HTTP from the internet,
so they get neither the claim and acknowledgement of mail nor any
administration; a compromised reader can at worst suppress addresses.
*/
IF DATABASE_PRINCIPAL_ID(N'MailqBounceReader') IS NULL
    CREATE ROLE MailqBounceReader AUTHORIZATION dbo;
