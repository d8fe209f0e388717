"""Bounces end to end against real servers: the worker sends with a VERP return
path through the lab's Postfix, Postfix bounces for real (unknown user, mailbox
full, delay), the DSNs land in a Dovecot mailbox, ``mailq-db bounces`` reads them
over IMAP (IMAPS and STARTTLS), records them and suppresses; enqueueing again is
refused.  Unsubscribes arrive by the List-Unsubscribe mailto: (through Postfix,
into the same mailbox) and by the RFC 8058 one-click POST (over HTTP).

The database side is the unit suite's FakeBounceQueue (the procedures'
documented contract); the procedures themselves are tested against SQL Server
in tests/integration/test_bounces_integration.py.
"""

from __future__ import annotations

import email
import email.policy
import os
import re
import smtplib
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from bounce_lab import BOUNCE_PASSWORD, BOUNCE_USER, BounceLab
from lab import running_lab
from fake_bounces import FakeBounceQueue
from realmta_helpers import account, make_mail, worker

from mailq_db.bounces import reader, verp
from mailq_db.bounces.parse import parse
from mailq_db.bounces.unsubscribe import make_app
from mailq_db.commands.unsubscribe import build_server
from mailq_db.connection import Backoff, ReconnectingConnection
from mailq_db.errors import SuppressedRecipientError

KEY = b"lab-bounce-key-0123456789abcdefghij"
OWN_CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "bounces" / "messages"


@pytest.fixture(scope="module")
def blab():
    reason = None
    if not os.path.exists("/usr/lib/dovecot/imap"):
        reason = "dovecot-imapd is not installed (apt-get install dovecot-imapd): the bounce mailbox is read over IMAP"
    yield from running_lab(BounceLab, "mailq-bouncelab-", "the Postfix + Dovecot bounce lab", reason)


def settings() -> verp.BounceSettings:
    return verp.BounceSettings(return_path="bounces+{token}@lab.test",
                               unsubscribe_url="https://unsubscribe.lab.test/u/{token}",
                               unsubscribe_mailto="bounces+{token}@lab.test", keys=(KEY,))


def reader_config(blab: BounceLab, *, tls: str = "implicit") -> reader.ReaderConfig:
    port = blab.imap_ports["imaps" if tls == "implicit" else "imap"]
    return reader.ReaderConfig(host="127.0.0.1", port=port, tls=tls, user=BOUNCE_USER, password=BOUNCE_PASSWORD,
                               account="default", ca_file=blab.ca_file, keys=(KEY,), timeout_seconds=10)


def db() -> ReconnectingConnection:
    from fake_queue import FakeConnection

    return ReconnectingConnection(FakeConnection, backoff=Backoff(0.001, 0.002), sleep=lambda s: None)


def folder_count(blab: BounceLab, folder: str) -> int:
    conn = blab.imap()
    try:
        typ, data = conn.select(f'"{folder}"', readonly=True)
        return int(data[0]) if typ == "OK" else -1
    finally:
        conn.logout()


def wait_inbox(blab: BounceLab, count: int, timeout: float = 30.0) -> int:
    """Messages in the bounce mailbox's INBOX, once there are ``count`` (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while True:
        n = folder_count(blab, "INBOX")
        if n >= count or time.monotonic() > deadline:
            return n
        time.sleep(0.2)


def send(blab: BounceLab, queue: FakeBounceQueue) -> None:
    w = worker(queue, {"default": account(blab, "mx", bounces=settings())})
    w.run(once=True)
    assert set(queue.statuses().values()) == {"Sent"}, queue.statuses()


def save_lab_dsns(files: list[Path]) -> None:
    """MAILQ_SAVE_LAB_DSNS=1: refresh tests/corpus/bounces/messages/lab-*.eml from this run."""
    if os.environ.get("MAILQ_SAVE_LAB_DSNS") != "1":
        return
    for path in files:
        report = parse(path.read_bytes())
        name = {"hard": "lab-unknown-user.eml", "soft": "lab-mailbox-full.eml", "delayed": "lab-delayed.eml"}
        if report.kind in name:
            (OWN_CORPUS / name[report.kind]).write_bytes(path.read_bytes())


def test_bounces_are_read_recorded_suppressed_and_refused_at_enqueue(blab: BounceLab):
    queue = FakeBounceQueue([
        make_mail(1, message_id="<b1@mailq.lab.test>", from_address="mailer@lab.test", to_address="nouser-1@lab.test"),
        make_mail(2, message_id="<b2@mailq.lab.test>", from_address="mailer@lab.test", to_address="full@lab.test"),
        make_mail(3, message_id="<b3@mailq.lab.test>", from_address="mailer@lab.test", to_address="slow@lab.test"),
        make_mail(4, message_id="<b4@mailq.lab.test>", from_address="mailer@lab.test", to_address="ok@lab.test"),
    ])
    send(blab, queue)
    # Postfix accepted every mail (250) and bounces later: three DSNs to bounces+<token>@lab.test
    files = blab.wait_files(blab.bounce_maildir, 3)
    assert len(files) == 3, blab.log()[-3000:]
    save_lab_dsns(files)
    assert len(blab.wait_files(blab.ok_maildir, 1)) == 1
    raws = [f.read_bytes() for f in files]
    assert all(re.search(rb"^Delivered-To: bounces\+[a-z2-7]+@lab\.test", r, re.MULTILINE) for r in raws)

    summary = reader.run_once(reader_config(blab), db(), queue)
    assert (summary.seen, summary.recorded, summary.failed) == (3, 3, 0)
    assert summary.suppressed == ["nouser-1@lab.test"]
    # per-recipient outcomes and events of the mails the tokens named
    assert queue.rows[1].recipients["nouser-1@lab.test"][0] == "Refused"
    assert queue.rows[2].recipients["full@lab.test"][0] == "Refused"
    assert "slow@lab.test" not in queue.rows[3].recipients
    kinds = {(e.mail_id, e.event_type) for e in queue.events}
    assert {(1, "Bounced"), (2, "Bounced"), (3, "BounceDelayed")} <= kinds
    statuses = {address: (r["kind"], r.get("status")) for (_, address), r in queue.reports.items()}
    assert statuses["nouser-1@lab.test"] == ("Hard", "5.1.1")
    assert statuses["full@lab.test"] == ("Soft", "5.2.2")
    assert statuses["slow@lab.test"][0] == "Delayed" and statuses["slow@lab.test"][1].startswith("4.")
    # only the hard bounce suppresses (hard limit 1; soft and delayed never by default)
    assert set(queue.suppressed) == {("default", "", "nouser-1@lab.test")}
    # moved out of INBOX, never deleted
    assert folder_count(blab, "INBOX") == 0 and folder_count(blab, "mailq-processed") == 3

    # re-reading the same reports records nothing new (copy them back into INBOX)
    conn = blab.imap()
    try:
        for raw in raws:
            conn.append("INBOX", None, None, raw)
    finally:
        conn.logout()
    again = reader.run_once(reader_config(blab, tls="starttls"), db(), queue)  # STARTTLS this time
    assert (again.seen, again.recorded, again.failed) == (3, 3, 0) and again.suppressed == []
    assert len([e for e in queue.events if e.event_type in ("Bounced", "BounceDelayed")]) == 3

    # enqueue again: refused for the suppressed address alone, the others go without it
    with pytest.raises(SuppressedRecipientError) as err:
        queue.enqueue_mail(None, to_address="nouser-1@lab.test", subject="again", body="x")
    assert err.value.number == 50600
    result = queue.enqueue_mail(None, to_address="ok@lab.test; nouser-1@lab.test", subject="again", body="x")
    assert queue.rows[result.mail_id].mail.to_address == "ok@lab.test"
    assert (result.mail_id, "RecipientSuppressed") in {(e.mail_id, e.event_type) for e in queue.events}


def test_failed_recording_leaves_the_message_in_place(blab: BounceLab):
    queue = FakeBounceQueue([make_mail(11, message_id="<b11@mailq.lab.test>", from_address="mailer@lab.test",
                                       to_address="nouser-11@lab.test")])
    before = len(blab.maildir_files(blab.bounce_maildir))
    send(blab, queue)
    assert len(blab.wait_files(blab.bounce_maildir, before + 1)) == before + 1
    queue.drop_connection("record_bounce", committed=False)
    queue.drop_connection("record_bounce", committed=False)
    queue.drop_connection("record_bounce", committed=False)
    queue.drop_connection("record_bounce", committed=False)
    queue.drop_connection("record_bounce", committed=False)
    queue.drop_connection("record_bounce", committed=False)
    box = reader.Mailbox(reader_config(blab))
    box.open()
    box.capabilities.discard("MOVE")  # the COPY + STORE \Deleted + EXPUNGE path of servers without MOVE
    try:
        failed = reader.run_once(reader_config(blab), db(), queue, mailbox=box)
        assert (failed.seen, failed.failed) == (1, 1)
        assert folder_count(blab, "INBOX") == 1  # still there, unrecorded
        ok = reader.run_once(reader_config(blab), db(), queue, mailbox=box)
        assert (ok.seen, ok.recorded, ok.failed) == (1, 1, 0)
    finally:
        box.close()
    assert folder_count(blab, "INBOX") == 0
    assert ("default", "", "nouser-11@lab.test") in queue.suppressed


def test_unsubscribe_by_mailto_and_by_one_click_post(blab: BounceLab):
    queue = FakeBounceQueue([
        make_mail(21, message_id="<u21@mailq.lab.test>", from_address="mailer@lab.test", to_address="ok@lab.test",
                  app_name="news", headers={"X-Mailq-Category": "bulk"}),
        make_mail(22, message_id="<u22@mailq.lab.test>", from_address="mailer@lab.test",
                  to_address="ok+two@lab.test", app_name="news", headers={"X-Mailq-Category": "bulk"}),
    ])
    before = len(blab.maildir_files(blab.ok_maildir))
    send(blab, queue)
    delivered = blab.wait_files(blab.ok_maildir, before + 2)[before:]
    messages = [email.message_from_bytes(p.read_bytes(), policy=email.policy.default) for p in delivered]
    by_id = {m["Message-ID"]: m for m in messages}
    one, two = by_id["<u21@mailq.lab.test>"], by_id["<u22@mailq.lab.test>"]
    assert one["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    https, mailto = [u.strip(" <>") for u in str(one["List-Unsubscribe"]).split(",")]

    # 1. mailto: a mail to the address goes through Postfix into the bounce mailbox
    address = mailto.removeprefix("mailto:").split("?")[0]
    with smtplib.SMTP("127.0.0.1", blab.ports["mx"], local_hostname="client.lab.test", timeout=20) as smtp:
        smtp.starttls(context=ssl.create_default_context(cafile=blab.ca_file))
        smtp.sendmail("ok@lab.test", [address], b"From: ok@lab.test\r\nTo: " + address.encode() +
                      b"\r\nSubject: unsubscribe\r\n\r\nunsubscribe\r\n")
    assert wait_inbox(blab, 1) == 1, blab.log()[-2000:]
    summary = reader.run_once(reader_config(blab), db(), queue)
    assert summary.unsubscribed == 1 and summary.failed == 0
    assert queue.suppressed[("default", "news", "ok@lab.test")].reason == "Unsubscribe"

    # 2. one-click: POST List-Unsubscribe=One-Click to the https URL's token (served over HTTP here)
    https_two = [u.strip(" <>") for u in str(two["List-Unsubscribe"]).split(",")][0]
    token = https_two.rsplit("/", 1)[1]
    app = make_app([KEY], lambda mail_id, rcpt, source: queue.record_unsubscribe(
        None, mail_id=mail_id, recipient_no=rcpt, source=source))
    server = build_server("127.0.0.1:0", app)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/u/"
        page = urllib.request.urlopen(base + token, timeout=10).read().decode()  # GET: a button, no unsubscribe
        assert 'method="post"' in page and ("default", "news", "ok+two@lab.test") not in queue.suppressed
        request = urllib.request.Request(base + token, data=b"List-Unsubscribe=One-Click", method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert urllib.request.urlopen(request, timeout=10).status == 200
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(base + token[:-2] + "aa", data=b"List-Unsubscribe=One-Click",
                                                          method="POST"), timeout=10)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
    assert queue.suppressed[("default", "news", "ok+two@lab.test")].reason == "Unsubscribe"
    assert https.startswith("https://unsubscribe.lab.test/u/")
    # the app's next bulk mail to ok@ is refused; another application may still mail it
    with pytest.raises(SuppressedRecipientError):
        queue.enqueue_mail(None, to_address="ok@lab.test", subject="more news", body="x", app_name="news")
    assert queue.enqueue_mail(None, to_address="ok@lab.test", subject="receipt", body="x", app_name="shop").created
