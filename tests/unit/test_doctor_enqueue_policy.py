"""mailq-db doctor's enqueue-policy section (issue 24 M3): what it prints for
each policy and visibility, from mailq.GetEnqueuePolicy's answer.  The
procedure is replaced by a stub: this tests the Python report, not the SQL
(tests/integration/test_enqueue_one_source.py runs both against SQL Server)."""

from __future__ import annotations

from datetime import datetime

import pytest

from mailq_db import procedures
from mailq_db.commands import doctor
from mailq_db.errors import DatabaseError


def checks_for(monkeypatch, policy) -> dict[str, doctor.Check]:
    def answer(conn):
        if isinstance(policy, Exception):
            raise policy
        return policy

    monkeypatch.setattr(procedures, "get_enqueue_policy", answer)
    return {c.name: c for c in doctor.enqueue_policy_checks(object())}


def policy(allow=False, visible=True, unmapped=()):
    return procedures.EnqueuePolicy(allow, datetime(2030, 1, 1), "ops", visible, list(unmapped))


def test_closed_and_every_user_mapped_is_ok(monkeypatch):
    checks = checks_for(monkeypatch, policy())
    assert checks["Enqueue policy"].status == "OK" and checks["Enqueue policy"].detail.startswith("closed")
    assert checks["Unmapped enqueuers"].status == "OK"


def test_unmapped_users_are_named_with_the_binding_that_maps_them(monkeypatch):
    checks = checks_for(monkeypatch, policy(unmapped=[("o'brien", "MailqEnqueuer"), ("dbo", "dbo")]))
    users = checks["Unmapped enqueuers"]
    assert users.status == "WARN" and "o'brien (via MailqEnqueuer)" in users.detail and "refused (50500)" in users.detail
    assert "@PrincipalName = N'o''brien';" in users.fix      # a runnable literal
    assert checks["Enqueue policy"].status == "OK"          # closed: the users are refused, the policy is fine


def test_open_with_unmapped_users_warns_on_the_policy_too(monkeypatch):
    checks = checks_for(monkeypatch, policy(allow=True, unmapped=[("app", "public")]))
    assert checks["Enqueue policy"].status == "WARN" and "open" in checks["Enqueue policy"].detail
    assert "ops" in checks["Enqueue policy"].detail and "enqueue unbound" in checks["Unmapped enqueuers"].detail


def test_invisible_memberships_are_never_reported_ok(monkeypatch):
    checks = checks_for(monkeypatch, policy(visible=False))
    assert checks["Unmapped enqueuers"].status == "WARN" and "unknown" in checks["Unmapped enqueuers"].detail


@pytest.mark.parametrize(("number", "expected"), [(doctor.NOT_DEPLOYED, set()), (229, {"Enqueue policy"})])
def test_a_missing_procedure_or_permission(monkeypatch, number, expected):
    checks = checks_for(monkeypatch, DatabaseError(number, "denied"))
    assert set(checks) == expected
