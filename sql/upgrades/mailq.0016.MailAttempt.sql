/*
Revision 0016: mailq.MailAttempt records the template version an attempt
rendered (issue 16, point 2, part B): TemplateVersion INT NULL, set by
mailq.ClaimMail when it opens the attempt (the version it resolved: the
mail's pinned one, else the template's latest active one); NULL for ordinary
mail and for earlier attempts.  An attempt's row is never re-resolved, so the
version an already-sent mail used never changes.  Nullable without a
default: no existing row needs a value.  Guarded; dynamic SQL for the
same reason as mailq.0016.MailQueue.sql.  Downgrade: DOWNGRADE_0016.
*/
IF COL_LENGTH(N'mailq.MailAttempt', N'TemplateVersion') IS NULL
    EXEC sys.sp_executesql N'ALTER TABLE mailq.MailAttempt ADD TemplateVersion INT NULL;';
