"""RFC 3464 delivery-status fields, read the forgiving way.

A ``message/delivery-status`` body is one per-message group and one group per
recipient, separated by blank lines (RFC 3464 2.1).  Real reports break that:
AOL writes no blank lines at all, IIS writes two, Exim and the RFC example
carry comments in Status ("5.0.0 (permanent failure)"), and a broken MIME
boundary leaves the fields inside a text part.  So the groups are rebuilt
here from the field names: a recipient starts at each ``Original-Recipient``
or ``Final-Recipient`` that cannot belong to the recipient being read.
RFC 6533's ``message/global-delivery-status`` has the same fields in UTF-8.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import mime, rules

FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*(.*)$")
RECIPIENT_FIELDS = ("original-recipient", "final-recipient", "action", "status", "diagnostic-code",
                    "remote-mta", "last-attempt-date", "will-retry-until", "x-actual-recipient")


@dataclass
class DsnRecipient:
    original: str | None = None
    final: str | None = None
    action: str | None = None
    status: str | None = None
    diagnostic: str | None = None

    @property
    def address(self) -> str | None:
        """The address the sender used (Original-Recipient), else the Final-Recipient."""
        return self.original or self.final


def fields(text: str) -> list[tuple[str, str] | None]:
    """(lower-cased name, value) per field, folded lines joined; None for a blank line."""
    out: list[tuple[str, str] | None] = []
    for line in re.split(r"\r?\n", text):
        if not line.strip():
            out.append(None)
            continue
        if line[0] in " \t" and out and out[-1] is not None:
            name, value = out[-1]
            out[-1] = (name, f"{value} {line.strip()}")
            continue
        m = FIELD.match(line)
        out.append((m.group(1).lower(), m.group(2).strip()) if m else None)
    return out


def _address(value: str) -> str | None:
    found = mime.addresses(value)
    return found[0] if found else None


def recipients(text: str) -> list[DsnRecipient]:
    """The recipient groups of a delivery-status body (see the module's docstring)."""
    out: list[DsnRecipient] = []
    current: DsnRecipient | None = None
    for item in fields(text):
        if item is None:
            if current is not None and current.final is not None:
                current = None
            continue
        name, value = item
        if name not in RECIPIENT_FIELDS:
            continue
        starts = name in ("original-recipient", "final-recipient")
        # a recipient field already set, or set after Action/Status: the next recipient
        if starts and (current is None or getattr(current, name.split("-")[0]) is not None
                       or current.action is not None or current.status is not None):
            current = DsnRecipient()
            out.append(current)
        if current is None:
            current = DsnRecipient()
            out.append(current)
        _set(current, name, value)
    return [r for r in out if r.address]


def _set(r: DsnRecipient, name: str, value: str) -> None:
    if name == "original-recipient":
        r.original = _address(value)
    elif name == "final-recipient" or name == "x-actual-recipient" and r.final is None:
        r.final = _address(value)
    elif name == "action":
        r.action = value.split()[0].lower() if value.split() else None
    elif name == "status":
        r.status = rules.clean_status(value)
    elif name == "diagnostic-code":
        r.diagnostic = value


def group_fields(text: str) -> dict[str, str]:
    """The first value of each field of a single-group report (feedback-report, MDN)."""
    out: dict[str, str] = {}
    for item in fields(text):
        if item is not None and item[0] not in out:
            out[item[0]] = item[1]
    return out
