/*
mailq.GetEventStreamStall: are the event stream and the hook dispatcher held back now (a
transaction that wrote a rowversion holds back MIN_ACTIVE_ROWVERSION()), and by whom?  docs/events.md.
Parameters:  @MinOpenSeconds INT 0-86400, default 0: list transactions open at least this long.
Result sets: 1. one row: HeldBack, MinActiveRowversion, NextRowversion (@@DBTS + 1), CanSeeTransactions,
                Permission (what the caller needs), OldestOpenSeconds; 2. when held back and visible:
                this database's open writing transactions, oldest first, with session and login
Permission:  EXECUTE; the DMVs are read with the caller's rights: VIEW SERVER STATE (2022: VIEW
             SERVER PERFORMANCE STATE; Azure: VIEW DATABASE STATE), else set 2 stays empty.
Errors:      50521 @MinOpenSeconds out of range.  Transaction: reads only.  Lock order: none.
Isolation:   sets READ COMMITTED; reads only DMVs.  Example: EXEC mailq.GetEventStreamStall @MinOpenSeconds = 30;
*/
CREATE OR ALTER PROCEDURE mailq.GetEventStreamStall
    @MinOpenSeconds INT = 0
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    SET @MinOpenSeconds = COALESCE(@MinOpenSeconds, 0);
    IF @MinOpenSeconds NOT BETWEEN 0 AND 86400
    BEGIN
        SET @Msg = CONCAT(N'@MinOpenSeconds must be 0-86400 (a day); got ', @MinOpenSeconds, N'.');
        THROW 50521, @Msg, 1;
    END;
    -- @@DBTS first: a write between the two reads cannot make an idle stream look held back.
    DECLARE @Next BIGINT = CAST(@@DBTS AS BIGINT) + 1;
    DECLARE @MinActive BIGINT = CAST(MIN_ACTIVE_ROWVERSION() AS BIGINT);
    DECLARE @HeldBack BIT = IIF(@MinActive < @Next, 1, 0);
    -- HAS_PERMS_BY_NAME is NULL for a permission the server does not know (before 2022).
    DECLARE @Azure BIT = IIF(CAST(SERVERPROPERTY('EngineEdition') AS INT) = 5, 1, 0);
    DECLARE @Permission NVARCHAR(200) = IIF(
        @Azure = 1,
        N'VIEW DATABASE STATE',
        N'VIEW SERVER STATE (SQL Server 2022 and later: VIEW SERVER PERFORMANCE STATE)'
    );
    DECLARE @CanSee BIT = 0;
    IF @Azure = 1 AND HAS_PERMS_BY_NAME(DB_NAME(), N'DATABASE', N'VIEW DATABASE STATE') = 1
        SET @CanSee = 1;
    IF
        @Azure = 0
        AND (
            HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER STATE') = 1
            OR COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER PERFORMANCE STATE'), 0) = 1
        )
        SET @CanSee = 1;
    DECLARE @Holder TABLE (
        SessionID INT NULL,
        TransactionID BIGINT NOT NULL PRIMARY KEY,
        TransactionName NVARCHAR(32) NULL,
        OpenSinceUtc DATETIME2(0) NULL,
        OpenSeconds INT NULL,
        State NVARCHAR(40) NOT NULL,
        SessionStatus NVARCHAR(30) NULL,
        ProgramName NVARCHAR(128) NULL,
        HostName NVARCHAR(128) NULL,
        LoginName NVARCHAR(128) NULL,
        LogRecords BIGINT NULL
    );
    IF @HeldBack = 1 AND @CanSee = 1
    BEGIN
        -- The DMVs report local time: durations against SYSDATETIME(), start shown in UTC.
        DECLARE @LocalNow DATETIME2(3) = SYSDATETIME();
        DECLARE @UtcNow DATETIME2(3) = SYSUTCDATETIME();
        INSERT INTO @Holder (
            SessionID, TransactionID, TransactionName, OpenSinceUtc, OpenSeconds, State,
            SessionStatus, ProgramName, HostName, LoginName, LogRecords
        )
        SELECT
            st.session_id,
            dt.transaction_id,
            tx.name,
            DATEADD(SECOND, -DATEDIFF(SECOND, tx.transaction_begin_time, @LocalNow), @UtcNow),
            DATEDIFF(SECOND, tx.transaction_begin_time, @LocalNow),
            CASE
                WHEN tx.transaction_state = 5 THEN N'prepared, waiting for MSDTC (in doubt)'
                WHEN tx.transaction_state IN (7, 8) THEN N'rolling back'
                WHEN tx.transaction_type = 4 THEN N'distributed, active'
                ELSE N'active'
            END,
            s.status,
            s.program_name,
            s.host_name,
            s.login_name,
            dt.database_transaction_log_record_count
        FROM sys.dm_tran_database_transactions AS dt
        LEFT JOIN sys.dm_tran_active_transactions AS tx ON dt.transaction_id = tx.transaction_id
        OUTER APPLY (
            SELECT TOP (1) x.session_id
            FROM sys.dm_tran_session_transactions AS x
            WHERE x.transaction_id = dt.transaction_id
            ORDER BY x.session_id ASC
        ) AS st
        LEFT JOIN sys.dm_exec_sessions AS s ON st.session_id = s.session_id
        WHERE
            dt.database_id = DB_ID()
            AND dt.database_transaction_type = 1           -- read/write (not system, not read-only)
            AND dt.database_transaction_state IN (4, 5)    -- has written (log records), or prepared
            AND COALESCE(DATEDIFF(SECOND, tx.transaction_begin_time, @LocalNow), 0) >= @MinOpenSeconds;
    END;
    SELECT
        @HeldBack AS HeldBack,
        @MinActive AS MinActiveRowversion,
        @Next AS NextRowversion,
        @CanSee AS CanSeeTransactions,
        @Permission AS Permission,
        (SELECT MAX(h.OpenSeconds) FROM @Holder AS h) AS OldestOpenSeconds;
    SELECT
        h.SessionID,
        h.TransactionID,
        h.TransactionName,
        h.OpenSinceUtc,
        h.OpenSeconds,
        h.State,
        h.SessionStatus,
        h.ProgramName,
        h.HostName,
        h.LoginName,
        h.LogRecords
    FROM @Holder AS h
    ORDER BY h.OpenSeconds DESC, h.TransactionID ASC;
END;
