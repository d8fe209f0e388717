"""Recipients and codes of plain-text bounces (no RFC 3464 fields).

Which addresses failed: the ``X-Failed-Recipients`` header (Exim, Gmail) when
present; else flufl.bounce's detectors (Mailman's, maintained as a library:
qmail, Exim, Yahoo, Sina, Exchange, Postfix texts and more) together with two
patterns of our own that flufl.bounce lacks -- a line holding only an address
(Domino, Notes, Gmail and the Chinese providers' layout) and ``RCPT TO:`` in a
transcript -- and, as the last resort, every address of the report's text
that is not the report's own sender or recipient.  The text next to each
address gives its enhanced code and whether it is a warning, a full mailbox
or an unknown user (:mod:`.rules`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from email.message import Message
from typing import Any

from . import mime, rules

ADDRESS = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
ALONE = re.compile(r"^[ \t>*-]*[<\"']?(" + ADDRESS.pattern + r")[>\"']?:?[ \t]*(?:\(.*\))?[ \t]*$",
                   re.MULTILINE)
RCPT_TO = re.compile(r"RCPT TO:?[ \t]*<?(" + ADDRESS.pattern + r")>?", re.IGNORECASE)
DAEMON = re.compile(r"^(?:mailer-daemon|postmaster|post_master|bounce[s]?|noreply|no-reply)@", re.IGNORECASE)
#: Codes too vague to outweigh the words: "other undefined status" (x.0.0) and
#: qmail's catch-all #5.5.0.
VAGUE = ("5.5.0",)

_flufl_all_failures: Callable[[Message], tuple[Any, Any]] | None
try:  # optional extra: pip install 'mailq-db[bounces]'
    from flufl.bounce import all_failures as _flufl_all_failures
except ImportError:  # pragma: no cover - depends on the installation
    _flufl_all_failures = None


def _own_addresses(msg: Message) -> set[str]:
    own: set[str] = set()
    for name in ("From", "To", "Return-Path", "Delivered-To", "X-Original-To", "Envelope-To", "Sender", "Cc"):
        for value in msg.get_all(name) or []:
            own.update(mime.addresses(str(value)))
    return own


def flufl_failures(msg: Message) -> list[str]:
    """flufl.bounce's verdict: every address its detectors find (temporary and permanent)."""
    if _flufl_all_failures is None:
        return []
    try:
        temporary, permanent = _flufl_all_failures(msg)
    except Exception:  # noqa: BLE001 - a third-party heuristic must never stop the reader
        return []
    out = []
    for item in [*permanent, *temporary]:
        text = item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
        text = text.strip().strip("<>").lower()
        if ADDRESS.fullmatch(text) and text not in out:
            out.append(text)
    return out


def _candidates(msg: Message, report: str) -> list[str]:
    failed = mime.addresses(mime.header(msg, "X-Failed-Recipients"))
    if failed:
        return failed
    own = _own_addresses(msg)
    found = [a for a in flufl_failures(msg) if a not in own]
    for pattern in (ALONE, RCPT_TO):
        for m in pattern.finditer(report):
            addr = m.group(1).lower()
            if addr not in own and addr not in found and not DAEMON.match(addr):
                found.append(addr)
    if found:
        return _in_text_order(found, report)
    rest = []
    for m in ADDRESS.finditer(report):
        addr = m.group(0).lower()
        if addr not in own and addr not in rest and not DAEMON.match(addr):
            rest.append(addr)
    return rest


def _in_text_order(found: list[str], report: str) -> list[str]:
    low = report.lower()
    return sorted(found, key=lambda a: (low.find(a) if a in low else len(low), found.index(a)))


def _window(report: str, address: str, others: list[str]) -> str:
    """The report's text about ``address``: from its first mention to the next recipient's."""
    low = report.lower()
    start = low.find(address)
    if start < 0:
        return report
    end = len(report)
    for other in others:
        if other == address:
            continue
        pos = low.find(other, start + len(address))
        if 0 <= pos < end:
            end = pos
    return report[start:min(end, start + 1500)]


def _status(window: str, report: str) -> str | None:
    codes = rules.enhanced_codes(window, failures_only=True)
    if not codes:
        whole = rules.enhanced_codes(report, failures_only=True)
        codes = whole if len(whole) == 1 else []
    specific = [c for c in codes if not rules.generic(c) and c not in VAGUE]
    return specific[0] if specific else (codes[0] if codes else None)


def _kind(status: str | None, window: str, report: str) -> str:
    if rules.DELAY_TEXT.search(report) and not rules.PERMANENT_TEXT.search(report):
        return "delayed"
    code = None if status is None or rules.generic(status) or status in VAGUE else status
    if code is None and rules.HARD_TEXT.search(window) is None and rules.FULL_TEXT.search(window) is None:
        return rules.failed_kind(None, report)
    return rules.failed_kind(code, window)


def plain_text_recipients(msg: Message) -> list[tuple[str, str | None, str, str | None]]:
    """(address, status, kind, diagnostic text) per failed recipient of a plain-text bounce."""
    parts = [mime.split_returned(t)[0] for t in mime.report_texts(msg)]
    report = "\n".join(parts)
    subject = mime.header(msg, "Subject")
    report_with_subject = f"{subject}\n{report}"
    candidates = _candidates(msg, report_with_subject)
    out = []
    for address in candidates:
        window = _window(report_with_subject, address, candidates)
        status = _status(window, report)
        kind = _kind(status, window, report_with_subject)
        diagnostic = re.sub(r"\s+", " ", window).strip()[:1000] or None
        out.append((address, status, kind, diagnostic))
    return out
