"""Issue 10, points 7 and 9 against SQL Server 2022: one lock order, purge
batches that never escalate, and unblocking that makes deferred mail visible.

* PurgeMail and RequeueMail run concurrently over the same 3,000 finished
  mails, in the same order: neither ever fails with deadlock 1205 (before
  revision 0007 the purge locked IX_MailQueue_Final keys first and the
  clustered rows second, RequeueMail the other way round).  A requeue may
  find its mail purged (50201) or the purge may skip a requeued mail: both are
  the expected outcomes of the race, and no mail is both purged and requeued.
* PurgeMail over 12,000 mails with 6 attempts each never escalates a lock on
  mailq.MailQueue or mailq.MailAttempt (sys.dm_db_index_operational_stats,
  index_lock_promotion_count unchanged).
* @OlderThanDays is capped: 36500 is accepted, 36501 is 50163 (it was error
  517, date arithmetic overflow, for very large values).
* UnblockSendingAccount makes mails deferred by a Wait visible now; a mail
  scheduled for later by its sender keeps its time.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from mailq_helpers import (
    bulk_fill,
    claim,
    connection,
    enqueue,
    execute,
    expect_error,
    mail_row,
    new_account,
    new_app,
    run_threads,
    scalar,
    server_now,
)
from mailq_db import procedures
from mailq_db.errors import DatabaseError, UnknownMailError, MailStateError

pytestmark = pytest.mark.integration


def finish_and_age(conn, account: str, days: int) -> list[int]:
    """Every UnSent bulk mail of ``account`` becomes Failed ``days`` days ago; returns their IDs."""
    execute(conn, "UPDATE q SET q.Status = N'Failed', q.DateProcessed = DATEADD(DAY, -?, SYSUTCDATETIME()) "
                  "FROM mailq.MailQueue AS q WHERE q.AccountName = ? AND q.Status = N'UnSent';", days, account)
    rows = procedures_rows(conn, "SELECT ID FROM mailq.MailQueue WHERE AccountName = ? ORDER BY DateProcessed, ID;",
                           account)
    return [r[0] for r in rows]


def procedures_rows(conn, sql, *params):
    cur = conn.cursor()
    try:
        cur.execute(sql, *params)
        return cur.fetchall()
    finally:
        cur.close()


def promotions(conn, table: str) -> int:
    return scalar(conn, "SELECT COALESCE(SUM(s.index_lock_promotion_count), 0) "
                        "FROM sys.dm_db_index_operational_stats(DB_ID(), OBJECT_ID(?), NULL, NULL) AS s;", table)


def test_purge_and_requeue_never_deadlock(mssql_url, conn):
    account = new_account(conn, "pr")
    bulk_fill(conn, account, 3000)
    ids = finish_and_age(conn, account, 10)
    deadlocks: list[BaseException] = []
    requeued: set[int] = set()
    lock = threading.Lock()

    def purger(i, barrier):
        with connection(mssql_url) as c:
            barrier.wait()
            total = 0
            while True:
                try:
                    n = procedures.purge_mail(c, older_than_days=5, batch_size=50)
                except DatabaseError as exc:
                    if getattr(exc, "number", None) == 1205:
                        deadlocks.append(exc)
                        continue
                    raise
                total += n
                if n == 0:
                    return total

    def requeuer(i, barrier):
        with connection(mssql_url) as c:
            barrier.wait()
            for mail_id in ids:
                try:
                    procedures.requeue_mail(c, mail_id=mail_id, date_to_process=None)
                    with lock:
                        requeued.add(mail_id)
                except (UnknownMailError, MailStateError):
                    pass                     # purged first (50201) or not final (50205)
                except DatabaseError as exc:
                    if getattr(exc, "number", None) == 1205:
                        deadlocks.append(exc)
                        continue
                    raise

    run_threads(2, lambda i, b: (purger if i == 0 else requeuer)(i, b), timeout=600)
    assert deadlocks == []
    left = {r[0] for r in procedures_rows(conn, "SELECT ID FROM mailq.MailQueue WHERE AccountName = ?;", account)}
    assert requeued <= left                       # nothing was both requeued and purged
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue WHERE AccountName = ? AND Status <> N'UnSent';",
                  account) == 0                   # every final mail was purged or requeued


def test_purge_never_escalates(conn):
    account = new_account(conn, "esc")
    bulk_fill(conn, account, 12_000)
    # six closed attempts per mail (the children a purge deletes first)
    execute(conn, """
        INSERT INTO mailq.MailAttempt (MailID, AttemptNo, LockToken, StartedAtUtc, EndedAtUtc, Outcome)
        SELECT q.ID, n.n, NEWID(), SYSUTCDATETIME(), SYSUTCDATETIME(), N'Retry'
        FROM mailq.MailQueue AS q CROSS JOIN (VALUES (1), (2), (3), (4), (5), (6)) AS n(n)
        WHERE q.AccountName = ?;""", account)
    finish_and_age(conn, account, 40)
    before = (promotions(conn, "mailq.MailQueue"), promotions(conn, "mailq.MailAttempt"))
    purged = procedures.purge_mail(conn, older_than_days=30, batch_size=1000)
    after = (promotions(conn, "mailq.MailQueue"), promotions(conn, "mailq.MailAttempt"))
    assert purged >= 12_000
    assert after == before


def test_older_than_days_is_capped(conn):
    assert procedures.purge_mail(conn, older_than_days=36500) >= 0
    expect_error(50163, lambda: procedures.purge_mail(conn, older_than_days=36501))
    expect_error(50163, lambda: procedures.purge_mail(conn, older_than_days=2_000_000_000))


def test_unblock_makes_wait_deferred_mail_visible_now(conn):
    account = new_account(conn, "unblock")
    app = new_app(conn, "unblock")
    waiting = enqueue(conn, account, app, 2)
    later = enqueue(conn, account, app, 1, date_to_process=None)[0]
    execute(conn, "UPDATE mailq.MailQueue SET DateToProcess = DATEADD(DAY, 1, SYSUTCDATETIME()), "
                  "VisibleAtUtc = DATEADD(DAY, 1, SYSUTCDATETIME()) WHERE ID = ?;", later.mail_id)
    token, mails = claim(conn, app, batch_size=10)
    assert {m.id for m in mails} == {w.mail_id for w in waiting}
    procedures.mark_failed(conn, ids=[m.id for m in mails], lock_token=token, disposition="Wait",
                           error="421 4.7.0 try later", retry_after_seconds=3600)
    now = server_now(conn)
    assert all(mail_row(conn, w.mail_id)["VisibleAtUtc"] > now for w in waiting)
    made_visible = procedures.unblock_sending_account(conn, account_name=account)
    assert made_visible == 2
    now = server_now(conn)
    assert all(mail_row(conn, w.mail_id)["VisibleAtUtc"] <= now for w in waiting)
    assert mail_row(conn, later.mail_id)["VisibleAtUtc"] > now
    token, again = claim(conn, app, batch_size=10)
    assert {m.id for m in again} == {w.mail_id for w in waiting}
    procedures.release_mail(conn, ids=[m.id for m in again], lock_token=token)
