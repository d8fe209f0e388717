/*
mailq.RecipientOutcomes: per-recipient results of mails that were accepted for
some recipients only (mailq.MailRecipientOutcome), with the mail's account and
current status: who did not get the mail (Refused: 5xx, final; Deferred: 4xx,
retried with the mail) and who did (Delivered).
*/
CREATE OR ALTER VIEW mailq.RecipientOutcomes
AS
SELECT
    o.MailID AS ID,
    q.AccountName,
    q.Status,
    o.Address,
    o.Outcome,
    o.SmtpCode,
    o.SmtpText,
    o.AttemptNo,
    o.UpdatedAtUtc
FROM mailq.MailRecipientOutcome AS o
INNER JOIN mailq.MailQueue AS q ON o.MailID = q.ID;
