"""Revision 0005 upgrades a database at 0004 in place, and downgrades (SQL Server 2022).

A database deployed to 0004 holds queued mail in every live state (UnSent
due, UnSent scheduled, Sending under a lease, an expired one, finished ones)
when ``alembic upgrade 0005`` runs.  Afterwards:

* every row of mailq.MailQueue, MailAttempt and RateBudget is exactly as
  before (no mail lost, none duplicated, no state changed);
* IX_MailQueue_ClaimByAccount, IX_MailQueue_Finalize, IX_MailQueue_Expiry
  exist, IX_MailQueue_Claim does not; mailq.FinalizeMail exists and
  MailqSender may execute it;
* the new claim takes the due mail, never the leased or scheduled mail.
``alembic downgrade 0004`` then restores 0004's claim and its index, removes
FinalizeMail and the new indexes, keeps every row, and 0004's claim works.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from mailq_helpers import (
    claim,
    connection,
    enqueue,
    fingerprint,
    new_account,
    new_app,
    scalar,
    server_now,
    statuses,
)
from mailq_db import procedures
from mailq_db.deployment import VERSION_TABLE, alembic_config

pytestmark = pytest.mark.integration

NEW_INDEXES = ("IX_MailQueue_ClaimByAccount", "IX_MailQueue_Finalize", "IX_MailQueue_Expiry")


def index_exists(conn, name: str) -> bool:
    return scalar(conn, "SELECT COUNT(*) FROM sys.indexes WHERE name = ? AND object_id = OBJECT_ID(N'mailq.MailQueue');",
                  name) == 1


def test_upgrade_0004_to_0005_in_place_keeps_every_mail_and_downgrades(fresh_database):
    from alembic import command

    url = fresh_database(deploy=False)
    cfg = alembic_config(x_args=[f"url={url}"])
    command.upgrade(cfg, "0004")

    with connection(url) as conn:
        account = new_account(conn, "upg", per_minute=1000)
        app = new_app(conn, "upg")
        now = server_now(conn)
        due = [r.mail_id for r in enqueue(conn, account, app, 20)]
        later = [r.mail_id for r in enqueue(conn, account, app, 3, date_to_process=now + timedelta(hours=1))]
        token, leased = claim(conn, app, batch_size=5)  # 0004's claim
        leased_ids = {m.id for m in leased}
        sent = leased[0].id
        procedures.mark_sent(conn, ids=[sent], lock_token=token)
        expiring = [r.mail_id for r in enqueue(conn, account, app, 2, expires_at_utc=now + timedelta(hours=2))]
        before = fingerprint(conn)
        assert index_exists(conn, "IX_MailQueue_Claim")

    command.upgrade(cfg, "0005")
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM dbo.{VERSION_TABLE};") == "0005"
        assert fingerprint(conn) == before, "the upgrade changed queued mail"
        assert not index_exists(conn, "IX_MailQueue_Claim")
        assert all(index_exists(conn, name) for name in NEW_INDEXES)
        assert scalar(conn, "SELECT HAS_PERMS_BY_NAME(N'mailq.FinalizeMail', N'OBJECT', N'EXECUTE');") == 1
        assert scalar(conn, "SELECT COUNT(*) FROM sys.database_permissions AS p "
                            "WHERE p.major_id = OBJECT_ID(N'mailq.FinalizeMail') "
                            "AND p.grantee_principal_id = DATABASE_PRINCIPAL_ID(N'MailqSender');") == 1
        # The new claim takes exactly the due, unleased mail, once.
        new_token, got = claim(conn, app, batch_size=100)
        expected = (set(due) - leased_ids) | set(expiring)
        assert {m.id for m in got} == expected
        assert set(statuses(conn, later).values()) == {"UnSent"}
        assert statuses(conn, [sent]) == {sent: "Sent"}
        assert set(statuses(conn, sorted(leased_ids - {sent})).values()) == {"Sending"}
        procedures.release_mail(conn, ids=[m.id for m in got], lock_token=new_token)
        between = fingerprint(conn)

    command.downgrade(cfg, "0004")
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM dbo.{VERSION_TABLE};") == "0004"
        assert fingerprint(conn) == between, "the downgrade changed queued mail"
        assert index_exists(conn, "IX_MailQueue_Claim")
        assert not any(index_exists(conn, name) for name in NEW_INDEXES)
        assert scalar(conn, "SELECT OBJECT_ID(N'mailq.FinalizeMail');") is None
        _, again = claim(conn, app, batch_size=100)  # 0004's claim works again
        assert {m.id for m in again} == expected

    command.upgrade(cfg, "head")

