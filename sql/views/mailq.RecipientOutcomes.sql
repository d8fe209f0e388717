/*
mailq.RecipientOutcomes: per-recipient results of mails accepted for some
recipients only, with the mail's account and status: Refused (5xx, final),
Deferred (4xx, retried with the mail), Delivered.
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
