/*
mailq.sysmail_unsentitems: msdb.dbo.sysmail_unsentitems over this queue: the rows of
mailq.sysmail_allitems whose sent_status is unsent or retrying (as msdb's view)
(https://learn.microsoft.com/en-us/sql/relational-databases/system-catalog-views/sysmail-unsentitems-transact-sql).
*/
CREATE OR ALTER VIEW mailq.sysmail_unsentitems
AS
SELECT
    i.mailitem_id,
    i.profile_id,
    i.recipients,
    i.copy_recipients,
    i.blind_copy_recipients,
    i.subject,
    i.body,
    i.body_format,
    i.importance,
    i.sensitivity,
    i.file_attachments,
    i.attachment_encoding,
    i.query,
    i.execute_query_database,
    i.attach_query_result_as_file,
    i.query_result_header,
    i.query_result_width,
    i.query_result_separator,
    i.exclude_query_output,
    i.append_query_error,
    i.send_request_date,
    i.send_request_user,
    i.sent_account_id,
    i.sent_status,
    i.sent_date,
    i.last_mod_date,
    i.last_mod_user
FROM mailq.sysmail_allitems AS i
WHERE i.sent_status IN ('unsent', 'retrying');
