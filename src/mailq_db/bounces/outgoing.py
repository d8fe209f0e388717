"""The worker's send-path hook: VERP return path and RFC 8058 headers for bulk mail.

:func:`prepare` wraps :func:`mailq_db.worker.message.build`:

* **List-Unsubscribe** (RFC 2369) with a signed https URL and a mailto:, and
  ``List-Unsubscribe-Post: List-Unsubscribe=One-Click`` (RFC 8058), for mail
  marked bulk by the business header ``X-Mailq-Category: bulk`` (the marker is
  removed; nothing in EnqueueMail's signature changes).  Added as business
  headers *before* the message is built, so a DKIM signature made while
  building covers them (RFC 8058 section 4 requires that).  Not added when the
  application wrote its own List-Unsubscribe, nor when the account has no
  ``unsubscribe_url``, nor for a mail with several recipients (one message
  body carries one link: bulk mail is addressed one recipient per mail).
* **Return path**: the envelope sender becomes ``return_path`` with the mail's
  token (``bounces+<token>@domain``); the From header is unchanged.  The same
  token goes in an ``X-Mailq-Token`` header, for complaints (ARF returns the
  headers, not the envelope) and for relays that replace the envelope sender.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from . import verp

log = logging.getLogger("mailq_db.bounces")

CATEGORY_HEADER = "X-Mailq-Category"
TOKEN_HEADER = "X-Mailq-Token"
BULK = "bulk"

OutT = TypeVar("OutT")


def _recipients(mail: Any) -> list[str]:
    from ..worker.message import (
        parse_addresses,  # the worker's own reading of the lists
    )

    seen: list[str] = []
    for value, what in ((mail.to_address, "ToAddress"), (mail.cc, "CC"), (mail.bcc, "BCC")):
        for a in parse_addresses(value, what):
            if a.addr_spec.lower() not in seen:
                seen.append(a.addr_spec.lower())
    return seen


def is_bulk(headers: dict[str, str] | None) -> bool:
    return any(k.lower() == CATEGORY_HEADER.lower() and str(v).strip().lower() == BULK
               for k, v in (headers or {}).items())


def unsubscribe_headers(settings: verp.BounceSettings, mail_id: int, recipient_no: int) -> dict[str, str]:
    """The two RFC 8058 headers for one recipient of one mail."""
    signer = settings.signer()
    token = signer.token(verp.UNSUBSCRIBE, mail_id, recipient_no)
    url = verp.fill(settings.unsubscribe_url or "", token)
    mailto = verp.fill(settings.unsubscribe_mailto or "", token)
    return {"List-Unsubscribe": f"<{url}>, <mailto:{mailto}?subject=unsubscribe>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}


def _headers(mail: Any, settings: verp.BounceSettings | None) -> dict[str, str] | None:
    """The business headers to build with, or None to keep the mail's own."""
    headers = dict(mail.headers or {})
    marker = [k for k in headers if k.lower() == CATEGORY_HEADER.lower()]
    if not marker:
        return None
    bulk = is_bulk(headers)
    for k in marker:
        headers.pop(k)
    if not bulk or settings is None or not settings.unsubscribe_url:
        return headers
    if any(k.lower() == "list-unsubscribe" for k in headers):
        return headers  # the application's own links win
    recipients = _recipients(mail)
    if len(recipients) != 1:
        log.warning("bulk mail %s has %d recipients: no List-Unsubscribe (one link per message; "
                    "send bulk mail one recipient per mail)", mail.id, len(recipients))
        return headers
    headers.update(unsubscribe_headers(settings, mail.id, 1))
    return headers


def prepare(mail: Any, account: Any, build: Callable[[Any], OutT]) -> OutT:
    """``build(mail)`` with the bulk headers and X-Mailq-Token added and the VERP
    envelope sender set (each only when the account has [accounts.NAME.bounces])."""
    settings: verp.BounceSettings | None = getattr(account, "bounces", None)
    headers = _headers(mail, settings)
    if settings is None:
        return build(mail if headers is None else replace(mail, headers=headers))
    token = settings.signer().token(verp.BOUNCE, mail.id, verp.recipient_no(_recipients(mail)))
    # The token in a header too: complaints (ARF) and relays that put their own
    # envelope sender on the mail (Microsoft 365, Gmail) return the headers.
    headers = dict(mail.headers or {}) if headers is None else headers
    headers = {k: v for k, v in headers.items() if k.lower() != TOKEN_HEADER.lower()}
    headers[TOKEN_HEADER] = token
    out = build(replace(mail, headers=headers))
    if not settings.return_path:
        return out
    return replace(out, envelope_from=verp.fill(settings.return_path, token))  # type: ignore[type-var]
