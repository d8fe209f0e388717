/*
mailq.GetMailHistory: one mail's story for `mailq-db dashboard` (its events: mailq.GetMailEvents).
Parameters:  @MailID BIGINT, required; an unknown ID returns three empty sets.
Result sets: 1. the mail (dtStamp as EnqueuedAtUtc); 2. its attempts, in order (ErrorText of
             a Sent attempt: the server's final reply); 3. each recipient's outcome.
Errors:      50583 @MailID missing.  Transaction: reads only.  Isolation: sets READ COMMITTED.
Lock order:  none (three clustered index seeks on the mail's key).
Example:     EXEC mailq.GetMailHistory @MailID = 101;
*/
CREATE OR ALTER PROCEDURE mailq.GetMailHistory
    @MailID BIGINT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    IF @MailID IS NULL
        THROW 50583, N'@MailID is required.', 1;
    SELECT
        q.ID,
        q.MessageID,
        q.AccountName,
        q.AppName,
        q.RunMode,
        q.Status,
        q.Priority,
        q.FromAddress,
        q.ToAddress,
        q.CC,
        q.BCC,
        q.Subject,
        q.dtStamp AS EnqueuedAtUtc,
        q.DateToProcess,
        q.VisibleAtUtc,
        q.SentAtUtc,
        q.DateProcessed,
        q.ExpiresAtUtc,
        q.AttemptCount,
        q.AttemptsRemaining,
        q.PossibleDuplicate,
        q.DryRun,
        q.LastError,
        q.TemplateName,
        q.TemplateVersion
    FROM mailq.MailQueue AS q
    WHERE q.ID = @MailID;
    SELECT
        t.AttemptNo,
        t.WorkerName,
        t.StartedAtUtc,
        t.EndedAtUtc,
        t.Outcome,
        t.SmtpCode,
        t.ErrorText,
        t.TemplateVersion
    FROM mailq.MailAttempt AS t
    WHERE t.MailID = @MailID
    ORDER BY t.AttemptNo;
    SELECT
        r.Address,
        r.Outcome,
        r.SmtpCode,
        r.SmtpText,
        r.AttemptNo,
        r.UpdatedAtUtc
    FROM mailq.MailRecipientOutcome AS r
    WHERE r.MailID = @MailID
    ORDER BY r.Address;
END;
