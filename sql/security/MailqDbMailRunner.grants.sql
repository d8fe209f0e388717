/*
Grants of role MailqDbMailRunner: claim a waiting query, hand back its result.
*/
GRANT EXECUTE ON OBJECT::mailq.ClaimDbMailQuery TO MailqDbMailRunner;
GRANT EXECUTE ON OBJECT::mailq.CompleteDbMailQuery TO MailqDbMailRunner;
