/*
mailq.GetMailHistory: one mail's story for `mailq-db dashboard`: the mail,
every attempt, and what each recipient got (its events come from
mailq.GetMailEvents @MailID).  An unknown ID returns three empty sets.
Parameters:  @MailID BIGINT, required.
Result sets: 1. the mail (0 or 1 row): ID, MessageID, AccountName, AppName,
                RunMode, Status, Priority, FromAddress, ToAddress, CC, BCC,
                Subject, EnqueuedAtUtc, DateToProcess, VisibleAtUtc,
                SentAtUtc, DateProcessed, ExpiresAtUtc, AttemptCount,
                AttemptsRemaining, PossibleDuplicate, DryRun, LastError,
                TemplateName, TemplateVersion
             2. attempts in order: AttemptNo, WorkerName, StartedAtUtc,
                EndedAtUtc, Outcome, SmtpCode, ErrorText (the server's final
                reply, with its queue ID, for a Sent attempt), TemplateVersion
             3. recipient outcomes: Address, Outcome, SmtpCode, SmtpText,
                AttemptNo, UpdatedAtUtc
Plan:        three clustered index seeks on the mail's key (PK_MailQueue,
             PK_MailAttempt, PK_MailRecipientOutcome): the same cost at any
             table size.
Errors:      50583 @MailID missing.
Transaction: reads only; opens none.  Isolation: sets READ COMMITTED itself.
Lock order:  none (no locking reads).
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
