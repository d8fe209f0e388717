/*
mailq.sysmail_profileaccount: msdb.dbo.sysmail_profileaccount's columns over
mailq.DbMailProfileAccount (the failover order of a profile's accounts).
*/
CREATE OR ALTER VIEW mailq.sysmail_profileaccount
AS
SELECT
    pa.ProfileID AS profile_id,
    pa.AccountID AS account_id,
    pa.SequenceNumber AS sequence_number,
    CAST(NULL AS DATETIME) AS last_mod_datetime,
    CAST(NULL AS SYSNAME) AS last_mod_user
FROM mailq.DbMailProfileAccount AS pa;
