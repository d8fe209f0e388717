/*
UX_SendingAccount_IsDefault: at most one default sending account.
*/
IF NOT EXISTS (
    SELECT 1
    FROM sys.indexes
    WHERE name = N'UX_SendingAccount_IsDefault' AND object_id = OBJECT_ID(N'mailq.SendingAccount')
)
BEGIN
    CREATE UNIQUE NONCLUSTERED INDEX UX_SendingAccount_IsDefault
    ON mailq.SendingAccount (IsDefault)
    WHERE IsDefault = 1;
END;
