"""The sysmail_* views' usual filters seek (M3): mailitem_id and
send_request_date on mailq.DbMailItem, and no scan of the whole queue or
event stream for any filter, at 20,000 queued mails beside the Database Mail items."""

from __future__ import annotations

import pytest

import re

from mailq_helpers import bulk_fill, new_account

SCAN = re.compile(r'<RelOp[^>]*PhysicalOp="(?:Clustered Index Scan|Index Scan|Table Scan)"[^>]*>.*?'
                  r'<Object [^>]*Table="\[(\w+)\]"', re.S)


@pytest.mark.parametrize("sql", [
    "SELECT mailitem_id FROM mailq.sysmail_allitems WHERE mailitem_id = 1;",
    "SELECT mailitem_id FROM mailq.sysmail_faileditems WHERE send_request_date > DATEADD(HOUR, -1, SYSDATETIME());",
    "SELECT log_id FROM mailq.sysmail_event_log WHERE mailitem_id = 1;",
    "SELECT log_id FROM mailq.sysmail_event_log WHERE event_type = 'error' AND log_date > DATEADD(HOUR, -1, SYSDATETIME());",
])
def test_filters_never_scan_the_queue(conn, sql):
    account = new_account(conn, "plan")
    bulk_fill(conn, account, 20_000)
    cursor = conn.cursor()
    cursor.execute("SET SHOWPLAN_XML ON;")
    try:
        cursor.execute(sql)
        xml_docs = [row[0] for row in cursor.fetchall()]
    finally:
        cursor.execute("SET SHOWPLAN_XML OFF;")
    text = "\n".join(xml_docs)
    scanned = {m.group(1) for m in SCAN.finditer(text)}
    assert not scanned & {"MailQueue", "MailEvent", "MailAttempt"}, scanned
    assert "IX_DbMailItem_SendRequestDate" in text or "PK_DbMailItem" in text
