/*
mailq.PurgeMail: deletes finished mail (Sent, Failed, Cancelled, Expired,
Stopped) whose DateProcessed is older than @OlderThanDays days, with its
attempts, attachments, recipient outcomes and events, in batches of
@BatchSize mails, one short transaction per batch.  Rows others hold are
skipped (READPAST) and left to the next purge.  Every statement touches at
most 1,000 rows per index, by forced seeks, far below lock escalation's
5,000 (docs/guarantees.md, "Lock order").
Parameters:  @OlderThanDays INT 0-36500 (100 years), required;
             @BatchSize INT 1-1000, default 500.
Result set:  one row: PurgedCount BIGINT.
Errors:      50135 @OlderThanDays missing or negative; 50163 @OlderThanDays
             over 36500 (the cutoff date would underflow, error 517);
             50140 @BatchSize out of range; 50141 called inside a transaction.
Transaction: must not be called inside one (50141): each batch commits on its
             own; an error rolls back the batch under way (earlier batches
             stay purged) and is re-raised.
Isolation:   sets READ COMMITTED itself: READPAST needs READ COMMITTED or
             REPEATABLE READ (error 650 otherwise), and REPEATABLE READ would
             keep every shared lock the candidate read takes; that read says
             READCOMMITTEDLOCK so that under READ_COMMITTED_SNAPSHOT it sees
             locks and READPAST can skip them.
Lock order:  mailq.MailQueue clustered rows (U; candidates are found on
             IX_MailQueue_Final without keeping a lock there), then
             mailq.MailAttempt, mailq.MailAttachment, mailq.MailRecipientOutcome,
             mailq.MailEvent, then the MailQueue rows' deletion.
Example:     EXEC mailq.PurgeMail @OlderThanDays = 30;
*/
CREATE OR ALTER PROCEDURE mailq.PurgeMail
    @OlderThanDays INT,
    @BatchSize INT = 500
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
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

            -- 1. Candidates: a range seek on IX_MailQueue_Final (covering),
            --    oldest first.  READCOMMITTEDLOCK, READPAST, ROWLOCK: S locks
            --    released row by row, rows others hold are skipped; nothing on
            --    the index stays locked while the rows below are taken.
            INSERT INTO @Candidate (ID)
            SELECT TOP (@BatchSize) q.ID
            FROM mailq.MailQueue AS q WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
                AND q.DateProcessed < @Cutoff
            ORDER BY q.DateProcessed ASC, q.ID ASC;

            IF @@ROWCOUNT = 0
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            -- 2. Lock the batch on the clustered index (the first lock every
            --    procedure takes on a mail) and re-check: a candidate may have
            --    been requeued in between.  FORCESEEK on the primary key keeps
            --    the plan off IX_MailQueue_Final.
            INSERT INTO @Batch (ID)
            SELECT q.ID
            FROM @Candidate AS c
            INNER JOIN mailq.MailQueue AS q WITH (FORCESEEK (PK_MailQueue (ID)), UPDLOCK, READPAST, ROWLOCK)
                ON c.ID = q.ID
            WHERE
                q.Status IN (N'Sent', N'Failed', N'Cancelled', N'Expired', N'Stopped')
                AND q.DateProcessed < @Cutoff;

            -- Every candidate was taken or changed meanwhile: stop here rather
            -- than spin; the next purge picks them up.
            IF NOT EXISTS (SELECT 1 FROM @Batch)
            BEGIN
                COMMIT TRANSACTION;
                BREAK;
            END;

            -- 3. Children, 1000 rows per statement, attempts before attachments.
            --    FORCESEEK: one seek per purged mail on the child's clustered
            --    key (MailID first), never a scan, which would lock its way
            --    through the rows of live mail (no READPAST here) and wait on
            --    the workers holding them.
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

            -- Recipient outcomes (up to 100 per mail) here too, not through the
            -- ON DELETE CASCADE of the parent delete: that one statement would
            -- lock up to 100 x @BatchSize rows of mailq.MailRecipientOutcome
            -- and escalate to a table lock past 5,000.
            SET @Deleted = 1000;
            WHILE @Deleted = 1000
            BEGIN
                DELETE TOP (1000) o
                FROM mailq.MailRecipientOutcome AS o WITH (FORCESEEK (PK_MailRecipientOutcome (MailID)), ROWLOCK)
                WHERE o.MailID IN (SELECT b.ID FROM @Batch AS b);
                SET @Deleted = @@ROWCOUNT;
            END;

            -- Events (about five per mail, more with retries): 1000 rows per
            -- statement, a seek per mail on IX_MailEvent_MailID, never a scan
            -- of the event history.  Nobody else changes a purged mail's
            -- events (they are only inserted, with a change of the mail,
            -- whose row this batch holds).
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
