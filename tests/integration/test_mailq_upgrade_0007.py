"""Revision 0007 upgrades a database at revision 0004 in place (SQL Server 2022).

A database deployed to 0004 holds queued, leased and finished mail, an
application with mail and one without, and an idempotency key.  Then
``alembic upgrade head``:

* every mail is still there, once, with the same ID, status, key, Message-ID
  and body (nothing lost, nothing duplicated), and the leased mail can still
  be acknowledged with its token;
* the idempotency key column is binary now and the same key still returns the
  same mail;
* each application was bound to what it already used (the one with mail to
  its account and From address, the one without mail to every account and
  each account's default From), so both keep enqueueing; a new application
  starts unbound (50160);
* 'large value types out of row' is on.

``alembic downgrade 0004`` restores the 0004 procedures and keeps every mail;
with two keys that differ only in case it is refused first (50167).
"""

from __future__ import annotations

import uuid

import pytest
from alembic import command

from mailq_helpers import connection, execute, expect_error, query, scalar
from mailq_db import procedures
from mailq_db.deployment import alembic_config

pytestmark = pytest.mark.integration

SNAPSHOT_SQL = ("SELECT ID, Status, IdempotencyKey, MessageID, Body, AccountName, AppName "
                "FROM mailq.MailQueue ORDER BY ID;")


def test_upgrade_from_0004_keeps_every_mail_and_binds_existing_applications(fresh_database):
    url = fresh_database(deploy=False)
    cfg = alembic_config(x_args=[f"url={url}"])
    command.upgrade(cfg, "0004")
    tag = uuid.uuid4().hex[:8]
    with connection(url) as c:
        procedures.upsert_sending_account(c, account_name=f"acc_{tag}", default_from_address="noreply@example.org",
                                          is_default=True)
        procedures.upsert_sending_account(c, account_name=f"other_{tag}", default_from_address="ops@example.net")
        procedures.upsert_application(c, app_name=f"busy_{tag}")
        procedures.upsert_application(c, app_name=f"idle_{tag}")
        for i in range(5):
            procedures.enqueue_mail(c, to_address=f"r{i}@example.com", subject=f"s{i}", body=f"b{i}",
                                    account_name=f"acc_{tag}", app_name=f"busy_{tag}",
                                    from_address="billing@example.org")
        keyed = procedures.enqueue_mail(c, to_address="k@example.com", subject="k", body="k",
                                        account_name=f"acc_{tag}", idempotency_key="Order-42")
        token = uuid.uuid4()
        leased = procedures.claim_mail(c, batch_size=2, lock_token=token, lease_seconds=600, app_name=f"busy_{tag}")
        procedures.mark_sent(c, ids=[leased[0].id], lock_token=token)
        before = query(c, SNAPSHOT_SQL)

    command.upgrade(cfg, "head")

    with connection(url) as c:
        assert query(c, SNAPSHOT_SQL) == before
        procedures.mark_sent(c, ids=[leased[1].id], lock_token=token)         # the lease survived
        again = procedures.enqueue_mail(c, to_address="k@example.com", subject="k", body="k",
                                        account_name=f"acc_{tag}", idempotency_key="Order-42")
        assert (again.mail_id, again.created) == (keyed.mail_id, False)
        assert scalar(c, "SELECT collation_name FROM sys.columns WHERE object_id = OBJECT_ID(N'mailq.MailQueue') "
                         "AND name = N'IdempotencyKey';") == "Latin1_General_100_BIN2"
        assert scalar(c, "SELECT CAST(large_value_types_out_of_row AS INT) FROM sys.tables "
                         "WHERE object_id = OBJECT_ID(N'mailq.MailQueue');") == 1
        assert set(query(c, "SELECT AppName, AccountName FROM mailq.ApplicationAccount;")) == {
            (f"busy_{tag}", f"acc_{tag}"), (f"idle_{tag}", f"acc_{tag}"), (f"idle_{tag}", f"other_{tag}")}
        assert set(query(c, "SELECT AppName, FromPattern FROM mailq.ApplicationFrom;")) == {
            (f"busy_{tag}", "billing@example.org"), (f"idle_{tag}", "noreply@example.org"),
            (f"idle_{tag}", "ops@example.net")}
        # both existing applications keep working with what they used
        procedures.enqueue_mail(c, to_address="r@example.com", subject="after", body="b", account_name=f"acc_{tag}",
                                app_name=f"busy_{tag}", from_address="billing@example.org")
        procedures.enqueue_mail(c, to_address="r@example.com", subject="after", body="b",
                                account_name=f"other_{tag}", app_name=f"idle_{tag}")
        procedures.upsert_application(c, app_name=f"new_{tag}")
        expect_error(50160, lambda: procedures.enqueue_mail(c, to_address="r@example.com", subject="n", body="b",
                                                            account_name=f"acc_{tag}", app_name=f"new_{tag}"))
        after_upgrade = query(c, SNAPSHOT_SQL)

        # keys that only a binary comparison tells apart block the downgrade
        twin = procedures.enqueue_mail(c, to_address="k@example.com", subject="k", body="k",
                                       account_name=f"acc_{tag}", idempotency_key="order-42")
        assert twin.created
    with pytest.raises(Exception, match="50167"):
        command.downgrade(cfg, "0004")
    with connection(url) as c:
        procedures.cancel_mail(c, mail_id=twin.mail_id)
        execute(c, "DELETE FROM mailq.MailQueue WHERE ID = ?;", twin.mail_id)   # test setup: as a purge would

    command.downgrade(cfg, "0004")
    with connection(url) as c:
        assert query(c, SNAPSHOT_SQL) == after_upgrade
        assert scalar(c, "SELECT OBJECT_ID(N'mailq.ApplicationAccount');") is None
        assert scalar(c, "SELECT OBJECT_ID(N'mailq.BindApplication');") is None
    command.upgrade(cfg, "head")                                                 # and up again
    with connection(url) as c:
        assert query(c, SNAPSHOT_SQL) == after_upgrade
