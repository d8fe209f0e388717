/*
mailq.PurgeMail: deletes final mail (Sent, Failed, Cancelled, Expired, Stopped)
processed more than @OlderThanDays days ago, with its attempts, attachments,
recipient outcomes, events and mailq.DbMailItem (cascade), @BatchSize mails per
transaction; rows others hold are skipped (READPAST).  At most 1,000 rows per
statement and index, by forced seeks (docs/dba-guide.md).
Parameters:  @OlderThanDays INT 0-36500, required; @BatchSize INT 1-1000 = 500
Result set:  one row: PurgedCount BIGINT
Errors:      50135 @OlderThanDays missing or negative; 50163 over 36500 (the cutoff
             would underflow, 517); 50140 @BatchSize out of range; 50141 in a transaction
Transaction: refuses one (50141); each batch commits on its own, also in implicit
             transaction mode (turned off inside); an error rolls back the batch
             under way (earlier batches stay purged) and is re-raised
Isolation:   READ COMMITTED (READPAST needs READ COMMITTED or REPEATABLE READ, which
             would keep every S lock); candidates read READCOMMITTEDLOCK
Lock order:  mailq.MailQueue rows (U), MailAttempt, MailAttachment,
             MailRecipientOutcome, MailEvent, then the MailQueue rows' deletion
Example:     EXEC mailq.PurgeMail @OlderThanDays = 30;
*/
CREATE OR ALTER PROCEDURE mailq.PurgeMail
    @OlderThanDays INT,
    @BatchSize INT = 500
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    -- Each BEGIN TRANSACTION must be a real one, not nested in an implicit one.
    SET IMPLICIT_TRANSACTIONS OFF;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    DECLARE @Msg NVARCHAR(2048);
    IF @OlderThanDays IS NULL OR @OlderThanDays < 0
    BEGIN
        SET @Msg = CONCAT(
            N'@OlderThanDays must be 0 or more; got ', COALESCE(CAST(@OlderThanDays AS NVARCHAR(12)), N'NULL'), N'.'
        );
        THROW 50135, @Msg, 1;
    END;
    IF @OlderThanDays > 36500
    BEGIN
        SET @Msg = CONCAT(N'@OlderThanDays must be at most 36500 (100 years); got ', @OlderThanDays, N'.');
        THROW 50163, @Msg, 1;
    END;
    SET @BatchSize = COALESCE(@BatchSize, 500);
    IF @BatchSize NOT BETWEEN 1 AND 1000
    BEGIN
        SET @Msg = CONCAT(N'@BatchSize must be 1-1000; got ', @BatchSize, N'.');
        THROW 50140, @Msg, 1;
    END;
    IF @@TRANCOUNT > 0
        THROW 50141, N'mailq.PurgeMail commits batch by batch: call it outside a transaction.', 1;
    DECLARE @Cutoff DATETIME2(3) = DATEADD(DAY, -@OlderThanDays, SYSUTCDATETIME());
    DECLARE @Purged BIGINT = 0;
    DECLARE @Candidate TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Batch TABLE (ID BIGINT NOT NULL PRIMARY KEY);
    DECLARE @Deleted INT;
    WHILE 1 = 1
    BEGIN
        DELETE FROM @Candidate;
        DELETE FROM @Batch;
        BEGIN TRY
            BEGIN TRANSACTION;
            -- 1. Candidates: covering range seek on IX_MailQueue_Final, oldest first, never
            --    a scan.  READCOMMITTEDLOCK, READPAST, ROWLOCK: S locks released row by row,
            --    rows others hold skipped.
            INSERT INTO @Candidate (ID)
            SELECT TOP (@BatchSize) q.ID
            FROM mailq.MailQueue AS q WITH (
                INDEX (IX_MailQueue_Final), FORCESEEK, READCOMMITTEDLOCK, READPAST, ROWLOCK
            )
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
                AND q.DateProcessed < @Cutoff
            ORDER BY q.DateProcessed ASC, q.ID ASC;
            IF @@ROWCOUNT = 0
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;
            -- 2. Lock the batch on the clustered index and re-check (a candidate may have
            --    been requeued); FORCESEEK keeps the plan off IX_MailQueue_Final.
            INSERT INTO @Batch (ID)
            SELECT q.ID
            FROM @Candidate AS c
            INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)), UPDLOCK, READPAST, ROWLOCK)
                ON c.ID = q.ID
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
                AND q.DateProcessed < @Cutoff;
            -- All taken or changed meanwhile: stop rather than spin.
            IF NOT EXISTS (SELECT 1 FROM @Batch)
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;
            -- 3. Children, 1000 rows per statement.  FORCESEEK: a seek per mail, never a
            --    scan that would wait on the rows of live mail.
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) t
                FROM mailq.MailAttempt AS t WITH (FORCESEEK (PK_MailAttempt (MailID)), ROWLOCK)
                WHERE t.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) a
                FROM mailq.MailAttachment AS a WITH (FORCESEEK (PK_MailAttachment (MailID)), ROWLOCK)
                WHERE a.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;
            -- Outcomes here, not by the parent's ON DELETE CASCADE: that one statement
            -- would lock up to 100 x @BatchSize rows and escalate past 5,000.
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) o
                FROM mailq.MailRecipientOutcome AS o WITH (FORCESEEK (PK_MailRecipientOutcome (MailID)), ROWLOCK)
                WHERE o.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;
            -- Events: a seek per mail on IX_MailEvent_MailID, 1000 rows per statement.
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) e
                FROM mailq.MailEvent AS e WITH (INDEX (IX_MailEvent_MailID), FORCESEEK, ROWLOCK)
                WHERE e.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;
            -- 4. The mails themselves (rows already held since step 2), by key.
            DELETE q
            FROM mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)), ROWLOCK)
            WHERE q.ID IN (SELECT b.ID FROM @Batch AS b);
            SET @Purged += @@ROWCOUNT;
            COMMIT TRANSACTION;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() <> 0 ROLLBACK TRANSACTION;
            THROW;
        END CATCH;
    END;
    SELECT @Purged AS PurgedCount;
END;
