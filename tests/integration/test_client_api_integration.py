"""The client API (mailq_db.client, issue 16 point 5) against SQL Server 2022.

What the unit tests cannot show: post's mail lives and dies with the caller's
transaction (pyodbc autocommit off, IMPLICIT_TRANSACTIONS under the driver);
emit's is committed; send follows mailq.GetMailEvents to the outcome the
worker's acknowledgement recorded (the worker is played by the sender's
procedures, ClaimMail then MarkSent / MarkFailed), MailTimeout leaves the mail
queued; StopMail gives MailStopped; events() reads an application's stream in
EventID order from a cursor.  Skipped here without SQL Server (conftest.py).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from mailq_helpers import claim, mail_row, new_account, new_app
from mailq_db import client, procedures
from mailq_db.connection import connect

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def account(conn) -> str:
    return new_account(conn, "client")


def mail(account: str, app: str, **kw):
    out = dict(to_address="rcpt@example.com", subject="client 你好", body="body",
               from_address="noreply@example.org", account_name=account, app_name=app)
    out.update(kw)
    return out


@pytest.fixture()
def manual(mssql_url):
    """A connection with autocommit off (pyodbc's default for applications)."""
    c = connect(mssql_url)
    c.autocommit = False
    yield c
    c.rollback()
    c.close()


def test_post_is_undone_with_the_callers_rollback(conn, manual, account):
    app = new_app(conn, "post")
    mail_id = client.post(manual, **mail(account, app))
    manual.rollback()
    assert mail_row(conn, mail_id) is None


def test_post_is_queued_when_the_caller_commits(conn, manual, account):
    app = new_app(conn, "post")
    mail_id = client.post(manual, **mail(account, app))
    manual.commit()
    assert mail_row(conn, mail_id)["Status"] == "UnSent"
    assert [e.event_type for e in client.events(conn, app)] == ["Enqueued"]


def test_emit_commits_and_an_idempotency_key_returns_the_same_mail(conn, manual, mssql_url, account):
    app = new_app(conn, "emit")
    key = f"order-{uuid.uuid4()}"
    with pytest.raises(client.CallerTransactionError):  # would commit the caller's transaction
        client.emit(manual, **mail(account, app, idempotency_key=key))
    first = client.emit(conn, **mail(account, app, idempotency_key=key))  # an autocommit connection
    second = client.emit(mssql_url, **mail(account, app, idempotency_key=key))  # a URL: own connection
    assert first == second and mail_row(conn, first)["Status"] == "UnSent"


def test_send_times_out_and_the_mail_stays_queued(conn, mssql_url, account):
    app = new_app(conn, "timeout")
    with pytest.raises(client.MailTimeout) as info:
        client.send(mssql_url, timeout=1.0, **mail(account, app))
    assert mail_row(conn, info.value.mail_id)["Status"] == "UnSent"
    assert info.value.event.event_type == "Enqueued"


def worker(url: str, app: str, act) -> threading.Thread:
    """A stand-in worker: claims the application's mail and acknowledges it with ``act``."""

    def run() -> None:
        acks = connect(url)
        try:
            for _ in range(600):
                token, mails = claim(acks, app)
                if mails:
                    act(acks, [m.id for m in mails], token)
                    return
                time.sleep(0.1)
        finally:
            acks.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_send_returns_the_sent_event(conn, mssql_url, account):
    app = new_app(conn, "sent")
    thread = worker(mssql_url, app, lambda c, ids, t: procedures.mark_sent(
        c, ids=ids, lock_token=t, smtp_code=250, smtp_text="2.0.0 OK queued"))
    event = client.send(mssql_url, timeout=60, **mail(account, app))
    thread.join(60)
    assert event.event_type == "Sent" and event.terminal
    assert mail_row(conn, event.mail_id)["Status"] == "Sent"


def test_send_raises_mail_failed_with_the_smtp_code(conn, mssql_url, account):
    app = new_app(conn, "failed")
    thread = worker(mssql_url, app, lambda c, ids, t: procedures.mark_failed(
        c, ids=ids, lock_token=t, disposition="Stop", error="550 5.1.1 user unknown", smtp_code=550))
    with pytest.raises(client.MailFailed) as info:
        client.send(mssql_url, timeout=60, **mail(account, app))
    thread.join(60)
    assert type(info.value) is client.MailFailed
    assert info.value.smtp_code == 550 and "user unknown" in (info.value.detail or "")


def test_stopped_mail_raises_mail_stopped_with_the_reason(conn, mssql_url, account):
    app = new_app(conn, "stopped")
    mail_id = client.emit(mssql_url, **mail(account, app))
    client.stop(mssql_url, mail_id, "bounced twice: address dead")
    with pytest.raises(client.MailStopped) as info:
        # what send does after its emit: follow the mail's events to the terminal one
        client.wait(conn, mail_id, deadline=time.monotonic() + 60, timeout=60)
    assert "bounced twice" in (info.value.detail or "")


def test_events_follow_the_cursor_in_order(conn, mssql_url, account):
    app = new_app(conn, "events")
    ids = [client.emit(conn, **mail(account, app)) for _ in range(3)]
    got = list(client.events(mssql_url, app, batch_size=2))
    assert [e.mail_id for e in got] == ids and all(e.event_type == "Enqueued" for e in got)
    assert [e.event_id for e in got] == sorted(e.event_id for e in got)
    more = client.emit(conn, **mail(account, app))
    after = list(client.events(conn, app, after=got[-1].event_id))
    assert [(e.mail_id, e.event_type) for e in after] == [(more, "Enqueued")]
