"""Competing and isolated workers claiming one application's mail: SQL Server
2022 (docs/claim.md, "Competing and isolated workers on the same mail").

Four competing workers (@AppName NULL, IX_MailQueue_ClaimByAccount) and four
isolated workers of the application (IX_MailQueue_ClaimByApp) claim 20,000
due mails of one account, each batch acknowledged at once.  Their picks go
through different indexes, so they overlap, and each lease UPDATE may need a
key lock the other's pick holds: the fourth reading expects deadlock victims
(1205) here.  The test prints how many; what it asserts is what must hold
whatever that count: every mail is leased exactly once (no ID in two
batches, none left), and every victim's claim left nothing behind (no
attempt without its mail's lease, no Sending mail at the end).
"""

from __future__ import annotations

import threading
import uuid

import pytest

from mailq_helpers import bulk_fill, connection, new_account, new_app, run_threads, scalar
from mailq_db import procedures
from mailq_db.errors import DatabaseError

pytestmark = pytest.mark.integration

MAILS = 20_000


def test_competing_and_isolated_workers_never_lease_one_mail_twice(mssql_url, conn):
    app, account = new_app(conn, "mixed"), new_account(conn, "mixed")
    bulk_fill(conn, account, MAILS, app=app)
    leased: list[list[int]] = [[] for _ in range(8)]
    victims = [0] * 8
    empty = [0] * 8
    lock = threading.Lock()

    def worker(i: int, barrier: threading.Barrier) -> None:
        isolated = i % 2 == 1
        with connection(mssql_url) as c:
            barrier.wait()
            while empty[i] < 3:
                token = uuid.uuid4()
                try:
                    mails = procedures.claim_mail(c, batch_size=50, lock_token=token, lease_seconds=600,
                                                  app_name=app if isolated else None, worker_name=f"mixed{i}",
                                                  account_names=[account])
                except DatabaseError as exc:
                    if exc.number == 1205:
                        with lock:
                            victims[i] += 1
                        continue
                    raise
                if not mails:
                    empty[i] += 1
                    continue
                empty[i] = 0
                leased[i].extend(m.id for m in mails)
                procedures.mark_sent(c, ids=[m.id for m in mails], lock_token=token, smtp_code=250)

    run_threads(8, worker, timeout=900)
    every = [mail_id for ids in leased for mail_id in ids]
    competing = sum(victims[i] for i in range(0, 8, 2))
    isolated = sum(victims[i] for i in range(1, 8, 2))
    print(f"{MAILS} mails, 4 competing + 4 isolated workers: {len(every)} leases, deadlock victims "
          f"{competing} competing / {isolated} isolated")
    assert len(every) == len(set(every)), "a mail was leased twice"
    assert len(every) == MAILS
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue WHERE AccountName = ? AND Status <> N'Sent';",
                  account) == 0
    assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailAttempt AS t INNER JOIN mailq.MailQueue AS q "
                        "ON q.ID = t.MailID WHERE q.AccountName = ? AND t.EndedAtUtc IS NULL;", account) == 0
