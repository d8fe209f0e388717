"""Build the RFC 5322 message and the SMTP envelope for one claimed mail.

* Message-ID and Date are the stored ones (the Date is the enqueue time), so
  a mail sent twice after a lost acknowledgement is recognisably the same mail.
* From/Reply-To/To/Cc go in headers; Bcc only in the envelope.
* Non-ASCII display names, subjects and header values are encoded per RFC 2047
  by :mod:`email`'s policy; bodies are base64 or quoted-printable, so the
  message is 7-bit clean unless an address needs SMTPUTF8.
* ASCII business headers keep their bytes (List-Unsubscribe and RFC 8058's
  List-Unsubscribe-Post must reach the receiver as written): they are never
  RFC 2047-encoded, only folded at whitespace when longer than 78 characters
  (RFC 5322 2.2.3: 78 preferred, 998 the hard limit); unfolding gives the
  stored value back exactly.
* Business headers are validated again here (the database validated them at
  enqueue): a bad one makes the mail malformed, never a header injection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from email import policy
from email.headerregistry import Address, HeaderRegistry
from email.message import EmailMessage
from email.utils import format_datetime, getaddresses

from ..procedures import Attachment, ClaimedMail

#: Headers a business header may never set (they are the worker's to write).
RESERVED_HEADERS = frozenset(
    h.lower()
    for h in ("From", "To", "Cc", "Bcc", "Subject", "Message-ID", "Date", "Reply-To", "Sender",
              "MIME-Version", "Return-Path", "Received", "Resent-From", "Resent-To",
              "Resent-Cc", "Resent-Bcc", "Resent-Sender", "Resent-Date", "Resent-Message-ID",
              "DKIM-Signature")
)
#: RFC 5322 ftext: printable US-ASCII except the colon.
FIELD_NAME = re.compile(r"^[\x21-\x39\x3b-\x7e]+$")


class _CachedHeaderRegistry(HeaderRegistry):
    """HeaderRegistry that builds each header class once (the stdlib builds a new
    class with ``type()`` on every header it parses, a third of the build time)."""

    def __init__(self) -> None:
        super().__init__()
        self._classes: dict[str, type] = {}

    def __getitem__(self, name: str) -> type:
        key = name.lower()
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = super().__getitem__(name)
        return cls


_REGISTRY = _CachedHeaderRegistry()
#: Message bodies are 7-bit clean (base64/quoted-printable), headers RFC 2047.
#: refold_source="none": a header set with set_raw (the ASCII business
#: headers, folded by fold_ascii_header) is written exactly as given; every
#: other header is a header object and is folded by the policy as before.
BUILD_POLICY = policy.SMTP.clone(cte_type="7bit", header_factory=_REGISTRY, refold_source="none")
UTF8_POLICY = policy.SMTPUTF8.clone(cte_type="7bit", header_factory=_REGISTRY, refold_source="none")
#: RFC 5322 2.1.1: lines SHOULD be at most 78 characters, MUST be at most 998.
PREFERRED_LINE, MAX_LINE = 78, 998


def fold_ascii_header(name: str, value: str) -> str:
    """``value`` folded for ``name: value`` at whitespace (a CRLF inserted before a
    space or tab, RFC 5322 2.2.3), lines at most 78 characters where a space allows;
    raises MalformedMail when a line cannot be kept within 998."""
    if len(name) + 2 + len(value) <= PREFERRED_LINE:
        return value
    # split before each run of whitespace: the pieces concatenate back to value
    pieces = re.findall(r"[ \t]*[^ \t]+|[ \t]+$", value)
    lines: list[str] = []
    current = ""
    used = len(name) + 2
    for piece in pieces:
        if current and used + len(current) + len(piece) > PREFERRED_LINE and piece[0] in " \t":
            lines.append(current)
            current, used = piece, 0
        else:
            current += piece
    lines.append(current)
    first = len(name) + 2 + len(lines[0])
    if first > MAX_LINE or any(len(x) > MAX_LINE for x in lines[1:]):
        raise MalformedMail(f"header {name} has a word longer than {MAX_LINE} characters (RFC 5322 2.1.1)")
    return "\r\n".join(lines)


class MalformedMail(ValueError):
    """The stored mail cannot be turned into a valid message (a Stop)."""


@dataclass(frozen=True)
class Outgoing:
    """What the SMTP layer sends: envelope and message bytes."""

    mail_id: int
    envelope_from: str
    recipients: tuple[str, ...]
    data: bytes
    smtputf8: bool  # True when an address is not ASCII: needs the server's SMTPUTF8


def _no_newlines(value: str | None, what: str) -> None:
    if value and ("\r" in value or "\n" in value):
        raise MalformedMail(f"{what} contains a line break (header injection refused)")


def parse_addresses(value: str | None, what: str) -> list[Address]:
    """Addresses from a ``;``-separated list (each item ``addr`` or ``Name <addr>``)."""
    if not value:
        return []
    _no_newlines(value, what)
    result = []
    for item in value.split(";"):
        item = item.strip()
        if not item:
            continue
        pairs = getaddresses([item])
        if len(pairs) != 1 or not pairs[0][1] or "@" not in pairs[0][1]:
            raise MalformedMail(f"{what}: {item!r} is not one e-mail address")
        name, addr = pairs[0]
        local, _, domain = addr.rpartition("@")
        if not local or not domain or any(c.isspace() or c in "<>()," for c in addr):
            raise MalformedMail(f"{what}: {addr!r} is not a valid address")
        result.append(Address(display_name=name, username=local, domain=domain))
    return result


def _is_ascii(text: str) -> bool:
    return text.isascii()


def validate_header(name: str, value: object) -> None:
    """Raise MalformedMail unless ``name: value`` is a safe business header."""
    if not isinstance(name, str) or not FIELD_NAME.match(name):
        raise MalformedMail(f"header name {name!r} is not RFC 5322 ftext")
    lowered = name.lower()
    if lowered in RESERVED_HEADERS or lowered.startswith("content-"):
        raise MalformedMail(f"header {name} may not be set by the application")
    if not isinstance(value, str):
        raise MalformedMail(f"header {name} must have a text value")
    _no_newlines(value, f"header {name}")


def _utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt


def message_id(stored: str) -> str:
    stored = stored.strip()
    _no_newlines(stored, "Message-ID")
    if not stored.startswith("<"):
        stored = f"<{stored}>"
    if not re.fullmatch(r"<[^<>\s@]+@[^<>\s@]+>", stored):
        raise MalformedMail(f"stored Message-ID {stored!r} is not <id@domain>")
    return stored


@dataclass(frozen=True)
class _Parties:
    """The mail's addresses, parsed and checked."""

    sender: Address
    to: list[Address]
    cc: list[Address]
    bcc: list[Address]
    reply_to: list[Address]

    @property
    def smtputf8(self) -> bool:
        """True when an address is not ASCII: the message needs the server's SMTPUTF8."""
        every = [self.sender, *self.to, *self.cc, *self.bcc, *self.reply_to]
        return not all(_is_ascii(a.addr_spec) for a in every)

    def recipients(self) -> tuple[str, ...]:
        """To, Cc and Bcc for the envelope, each address once (case-insensitively)."""
        out: list[str] = []
        for a in (*self.to, *self.cc, *self.bcc):
            if a.addr_spec.lower() not in (r.lower() for r in out):
                out.append(a.addr_spec)
        return tuple(out)


def _parties(mail: ClaimedMail) -> _Parties:
    sender = parse_addresses(mail.from_address, "FromAddress")
    if len(sender) != 1:
        raise MalformedMail("FromAddress must be exactly one address")
    _no_newlines(mail.from_name, "FromName")
    _no_newlines(mail.subject, "Subject")
    parties = _Parties(
        Address(display_name=mail.from_name or sender[0].display_name, username=sender[0].username,
                domain=sender[0].domain),
        parse_addresses(mail.to_address, "ToAddress"), parse_addresses(mail.cc, "CC"),
        parse_addresses(mail.bcc, "BCC"), parse_addresses(mail.reply_to, "ReplyTo"))
    if not (parties.to or parties.cc or parties.bcc):
        raise MalformedMail("the mail has no recipient")
    for name, value in (mail.headers or {}).items():
        validate_header(name, value)
    return parties


def _set_headers(msg: EmailMessage, mail: ClaimedMail, parties: _Parties) -> None:
    msg["Message-ID"] = message_id(mail.message_id)
    msg["Date"] = format_datetime(_utc(mail.dt_stamp))
    msg["From"] = parties.sender
    if parties.reply_to:
        msg["Reply-To"] = parties.reply_to
    if parties.to:
        msg["To"] = parties.to
    if parties.cc:
        msg["Cc"] = parties.cc
    msg["Subject"] = mail.subject or ""
    for name, value in (mail.headers or {}).items():
        if value.isascii():
            msg.set_raw(name, fold_ascii_header(name, value))  # kept byte for byte
        else:
            msg[name] = value  # RFC 2047 by the policy


def _set_body(msg: EmailMessage, mail: ClaimedMail) -> None:
    if mail.body_format == "Html":
        if mail.text_body:
            msg.set_content(mail.text_body)
            msg.add_alternative(mail.body, subtype="html")
        else:
            msg.set_content(mail.body, subtype="html")
    elif mail.body_format == "Text":
        msg.set_content(mail.body or "")
    else:
        raise MalformedMail(f"unknown BodyFormat {mail.body_format!r}")
    for att in mail.attachments:
        if not isinstance(att, Attachment):
            raise MalformedMail(f"attachment {att.file_name!r} was never generated (a lazy attachment)")
        _no_newlines(att.file_name, "attachment file name")
        maintype, _, subtype = (att.content_type or "application/octet-stream").partition("/")
        if not subtype or not FIELD_NAME.match(maintype) or not FIELD_NAME.match(subtype):
            raise MalformedMail(f"attachment {att.file_name!r}: bad content type {att.content_type!r}")
        msg.add_attachment(att.content, maintype=maintype, subtype=subtype, filename=att.file_name)


def build(mail: ClaimedMail) -> Outgoing:
    """The message and envelope for ``mail``; raises MalformedMail (a Stop)."""
    parties = _parties(mail)
    build_policy = UTF8_POLICY if parties.smtputf8 else BUILD_POLICY
    msg = EmailMessage(policy=build_policy)
    try:
        _set_headers(msg, mail, parties)
        _set_body(msg, mail)
        data = msg.as_bytes(policy=build_policy)
    except MalformedMail:
        raise
    except (ValueError, TypeError, IndexError) as exc:
        raise MalformedMail(f"cannot build the message: {exc}") from exc
    return Outgoing(mail.id, parties.sender.addr_spec, parties.recipients(), data, parties.smtputf8)
