/*
Grants of role MailqDelayCaller: EXECUTE on dbo.InitiateDelayExecution and
dbo.CancelDelayExecution, nothing else.  Both run as the caller and reach the
tables by ownership chaining; the timer is set through delay.ArmDispatcher
(EXECUTE AS OWNER), granted to nobody.
*/
GRANT EXECUTE ON OBJECT::dbo.InitiateDelayExecution TO MailqDelayCaller;
GRANT EXECUTE ON OBJECT::dbo.CancelDelayExecution TO MailqDelayCaller;
