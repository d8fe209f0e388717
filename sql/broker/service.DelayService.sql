/*
Service //mailq-db/DelayService on dbo.DelayServiceQueue.  Each task is a dialog
from this service to itself (TO SERVICE N'//mailq-db/DelayService',
N'CURRENT DATABASE'); both endpoints live on the one queue.
*/
IF NOT EXISTS (SELECT 1 FROM sys.services WHERE name = N'//mailq-db/DelayService')
    CREATE SERVICE [//mailq-db/DelayService]
        ON QUEUE dbo.DelayServiceQueue ([//mailq-db/DelayContract]);
