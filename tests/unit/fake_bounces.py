"""FakeBounceQueue: FakeQueue plus the suppression procedures' documented contract.

A test double of the DATABASE LAYER for the bounce reader, the unsubscribe
endpoint and enqueue-time suppression (docs/bounces.md), not a test of the
procedures: mailq.RecordBounce, RecordUnsubscribe, AddSuppression,
RemoveSuppression, ListSuppressions and the suppression block of
EnqueueMail are tested against SQL Server in
tests/integration/test_bounces_integration.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fake_queue import FakeQueue, Row

from mailq_db.errors import (
    InvalidInputError,
    SuppressedRecipientError,
    UnknownUnsubscribeError,
)
from mailq_db.procedures import BounceRecorded, EnqueueResult, SuppressionStats


@dataclass
class Event:
    mail_id: int
    event_type: str
    detail: str


@dataclass
class Suppression:
    reason: str
    source: str
    mail_id: int | None


def _addresses(value: str | None) -> list[tuple[str, str]]:
    """(entry, lower-case address) per entry of a ';' list (EnqueueMail's format)."""
    out = []
    for entry in (value or "").split(";"):
        entry = entry.strip()
        if not entry:
            continue
        addr = entry[entry.index("<") + 1:entry.rindex(">")] if "<" in entry and entry.endswith(">") else entry
        out.append((entry, addr.lower()))
    return out


class FakeBounceQueue(FakeQueue):
    def __init__(self, mails: Iterable[Any] = (), **kw: Any) -> None:
        super().__init__(mails, **kw)
        self.suppressed: dict[tuple[str, str, str], Suppression] = {}
        self.reports: dict[tuple[bytes, str], dict[str, Any]] = {}
        self.events: list[Event] = []
        self.accounts = {"default"}

    # -- helpers --------------------------------------------------------------
    def recipients_of(self, mail_id: int) -> list[str]:
        m = self.rows[mail_id].mail
        seen: list[str] = []
        for value in (m.to_address, m.cc, m.bcc):
            for _, a in _addresses(value):
                if a not in seen:
                    seen.append(a)
        return seen

    def is_suppressed(self, account: str, app: str | None, address: str) -> bool:
        return any((account, scope, address.lower()) in self.suppressed for scope in ("", app or ""))

    def _suppress(self, account: str, app: str, address: str, reason: str, source: str, mail_id: int | None) -> None:
        self.suppressed[(account, app, address)] = Suppression(reason, source, mail_id)
        for row in self.rows.values():  # the sweep of queued mail
            m = row.mail
            if row.status != "UnSent" or m.account_name != account or (app and m.app_name != app):
                continue
            lists = [[(e, a) for e, a in _addresses(v) if a != address] for v in (m.to_address, m.cc, m.bcc)]
            if sum(map(len, lists)) == sum(len(_addresses(v)) for v in (m.to_address, m.cc, m.bcc)):
                continue
            if not any(lists):
                row.status = "Stopped"
                self.events.append(Event(m.id, "Stopped", f"every recipient is suppressed: {address}"))
                continue
            m.to_address = "; ".join(e for e, _ in lists[0])
            m.cc = "; ".join(e for e, _ in lists[1]) or None
            m.bcc = "; ".join(e for e, _ in lists[2]) or None
            self.events.append(Event(m.id, "RecipientSuppressed", f"not sent to (suppressed): {address}"))

    # -- mailq.RecordBounce -----------------------------------------------------
    def record_bounce(self, conn: Any, *, report_key: bytes, recipients: Iterable[dict[str, Any]], source: str,
                      account_name: str | None = None, mail_id: int | None = None,
                      recipient_no: int | None = None, hard_bounce_limit: int = 1,
                      soft_bounce_limit: int | None = None) -> list[BounceRecorded]:
        items = [dict(r) for r in recipients]

        def run() -> list[BounceRecorded]:
            assert len(report_key) == 32, "50607"
            row = self.rows.get(mail_id) if mail_id is not None else None
            account = row.mail.account_name if row else account_name
            if account not in self.accounts:
                raise InvalidInputError(50601, f"@AccountName {account!r} is not a sending account")
            out = []
            token_address = self.recipients_of(row.mail.id)[recipient_no - 1] if row and recipient_no else None
            if token_address and len(items) == 1 and items[0].get("address") \
                    and items[0]["address"].lower() not in self.recipients_of(row.mail.id):
                items[0]["address"] = token_address  # a forwarding alias: the token's recipient
            for r in items:
                address = r.get("address") or token_address
                if not address:
                    raise InvalidInputError(50602, "a recipient without an address")
                assert r["kind"] in ("Hard", "Soft", "Delayed", "Complaint"), "50608"
                key = (bytes(report_key), address.lower())
                new = key not in self.reports
                suppressed = False
                if new:
                    self.reports[key] = dict(r, account=account, mail_id=row.mail.id if row else None)
                    suppressed = self._limit_reached(account, address.lower(), r["kind"], hard_bounce_limit,
                                                     soft_bounce_limit)
                    if suppressed:
                        reason = {"Complaint": "Complaint", "Hard": "HardBounce"}.get(r["kind"], "SoftBounce")
                        self._suppress(account, "", address.lower(), reason, source, mail_id)
                    if row is not None:
                        self._on_mail(row, address.lower(), r)
                out.append(BounceRecorded(address.lower(), r["kind"], row.mail.id if row else None, new, suppressed))
            return out
        return self._apply("record_bounce", dict(report_key=report_key, recipients=items, source=source,
                                                 account_name=account_name, mail_id=mail_id,
                                                 recipient_no=recipient_no), run)

    def _limit_reached(self, account: str, address: str, kind: str, hard: int, soft: int | None) -> bool:
        count = len({v["mail_id"] if v["mail_id"] is not None else key for (key, a), v in self.reports.items()
                     if a == address and v["account"] == account and v["kind"] == kind})  # one per mail
        return kind == "Complaint" or (kind == "Hard" and count >= hard) or (
            kind == "Soft" and soft is not None and count >= soft)

    def _on_mail(self, row: Row, address: str, r: dict[str, Any]) -> None:
        event = {"Delayed": "BounceDelayed", "Complaint": "Complained"}.get(r["kind"], "Bounced")
        self.events.append(Event(row.mail.id, event, f"{address}: {r['kind']} {r.get('status')}"))
        if r["kind"] in ("Hard", "Soft"):
            row.recipients[address] = ("Refused", r.get("code"), f"bounced later ({r.get('status')})")

    # -- mailq.RecordUnsubscribe -------------------------------------------------
    def record_unsubscribe(self, conn: Any, *, mail_id: int, recipient_no: int, source: str) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            row = self.rows.get(mail_id)
            if row is None:
                raise UnknownUnsubscribeError(50611, f"Mail {mail_id} does not exist")
            rcpts = self.recipients_of(mail_id)
            if not 1 <= recipient_no <= len(rcpts):
                raise UnknownUnsubscribeError(50612, f"@RecipientNo {recipient_no} is not a recipient")
            address = rcpts[recipient_no - 1]
            key = (hashlib.sha256(f"unsubscribe:{mail_id}:{recipient_no}".encode()).digest(), address)
            new = key not in self.reports
            if new:
                self.reports[key] = {"kind": "Unsubscribe", "account": row.mail.account_name, "mail_id": mail_id}
                self.events.append(Event(mail_id, "Unsubscribed", f"{address} ({source})"))
            if new or not self.is_suppressed(row.mail.account_name, row.mail.app_name, address):
                self._suppress(row.mail.account_name, row.mail.app_name or "", address, "Unsubscribe", source,
                               mail_id)
            return {"MailID": mail_id, "AccountName": row.mail.account_name, "AppName": row.mail.app_name,
                    "Address": address, "Recorded": new}
        return self._apply("record_unsubscribe", dict(mail_id=mail_id, recipient_no=recipient_no, source=source),
                           run)

    # -- mailq.EnqueueMail's suppression block -----------------------------------
    def enqueue_mail(self, conn: Any, **kwargs: Any) -> EnqueueResult:
        account = kwargs.get("account_name") or "default"
        app = kwargs.get("app_name")
        lists, dropped = [], []
        for name in ("to_address", "cc", "bcc"):
            kept = []
            for entry, addr in _addresses(kwargs.get(name)):
                (dropped if self.is_suppressed(account, app, addr) else kept).append((entry, addr))
            lists.append(kept)
        if dropped and not any(lists):
            self.calls.append(("enqueue_mail", dict(kwargs)))
            raise SuppressedRecipientError(50600, "Every recipient is suppressed for account "
                                           f"'{account}': {'; '.join(a for _, a in dropped)}")
        kwargs = dict(kwargs, to_address="; ".join(e for e, _ in lists[0]),
                      cc="; ".join(e for e, _ in lists[1]) or None, bcc="; ".join(e for e, _ in lists[2]) or None)
        result = super().enqueue_mail(conn, **kwargs)
        if dropped:
            self.events.append(Event(result.mail_id, "RecipientSuppressed",
                                     f"not sent to (suppressed): {'; '.join(a for _, a in dropped)}"))
        return result

    # -- mailq.GetSuppressionStats, ListSuppressions, Add/RemoveSuppression -----
    def get_suppression_stats(self, conn: Any, *, days: int | None = None) -> SuppressionStats:
        def run() -> SuppressionStats:
            reasons: dict[tuple[str, str], int] = {}
            for (account, _, _), s in self.suppressed.items():
                reasons[(account, s.reason)] = reasons.get((account, s.reason), 0) + 1
            kinds: dict[tuple[str, str], int] = {}
            for r in self.reports.values():
                kinds[(r["account"], r["kind"])] = kinds.get((r["account"], r["kind"]), 0) + 1
            sent: dict[str, int] = {}
            for row in self.rows.values():
                if row.status == "Sent":
                    sent[row.mail.account_name] = sent.get(row.mail.account_name, 0) + 1
            return SuppressionStats(
                [{"AccountName": a, "Reason": r, "Suppressed": n} for (a, r), n in sorted(reasons.items())],
                [{"AccountName": a, "Kind": k, "Reports": n, "Mails": n, "LastAtUtc": None}
                 for (a, k), n in sorted(kinds.items())],
                [{"AccountName": a, "Sent": n} for a, n in sorted(sent.items())])
        return self._apply("get_suppression_stats", {"days": days}, run)

    def list_suppressions(self, conn: Any, **kw: Any) -> list[dict[str, Any]]:
        def run() -> list[dict[str, Any]]:
            return [{"AccountName": a, "AppName": app or None, "Address": addr, "Reason": s.reason,
                     "Source": s.source, "UpdatedAtUtc": None, "ExpiresAtUtc": None}
                    for (a, app, addr), s in sorted(self.suppressed.items())
                    if kw.get("account_name") in (None, a) and kw.get("address") in (None, addr)]
        return self._apply("list_suppressions", dict(kw), run)

    def add_suppression(self, conn: Any, *, account_name: str, address: str, source: str,
                        reason: str = "Manual", app_name: str | None = None, **kw: Any) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            before = [e for e in self.events]
            self._suppress(account_name, app_name or "", address.lower(), reason, source, None)
            new = self.events[len(before):]
            return {"AccountName": account_name, "AppName": app_name, "Address": address.lower(), "Reason": reason,
                    "SweptMails": len(new), "StoppedMails": sum(e.event_type == "Stopped" for e in new)}
        return self._apply("add_suppression", {"account_name": account_name, "address": address, "source": source,
                                               "reason": reason, "app_name": app_name, **kw}, run)

    def remove_suppression(self, conn: Any, *, account_name: str, address: str, source: str,
                           app_name: str | None = None, **kw: Any) -> int:
        def run() -> int:
            return 1 if self.suppressed.pop((account_name, app_name or "", address.lower()), None) else 0
        return self._apply("remove_suppression", {"account_name": account_name, "address": address,
                                                  "source": source, "app_name": app_name}, run)
