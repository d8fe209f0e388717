/*
Activation of dbo.DelayServiceQueue: Service Broker starts dbo.ProcessDelayQueue
when messages arrive faster than the running readers receive them, up to
MAX_QUEUE_READERS instances.
    MAX_QUEUE_READERS = 5   the default; the Alembic revision that deploys this
                            file changes it with ALTER QUEUE when run with
                            -x readers=N (1-32767), and a DBA may change it at
                            any time with ALTER QUEUE ... WITH ACTIVATION
                            (MAX_QUEUE_READERS = N)
    EXECUTE AS OWNER        the procedure runs as the queue's owner (dbo), so it
                            can run the allow-listed targets in any schema of
                            this database; it gains no server-level rights,
                            because the database is never marked trusted
A separate file because the procedure must exist before activation names it,
and it RECEIVEs from the queue, so the queue must exist before the procedure.
*/
ALTER QUEUE dbo.DelayServiceQueue
    WITH ACTIVATION (
        STATUS = ON,
        PROCEDURE_NAME = dbo.ProcessDelayQueue,
        MAX_QUEUE_READERS = 5,
        EXECUTE AS OWNER
    );
