"""Small, forgiving MIME helpers for delivery reports (broken boundaries, raw 8-bit, odd charsets)."""

from __future__ import annotations

import email
import email.header
import email.policy
import email.utils
import quopri
import re
from collections.abc import Iterator
from email.message import Message

#: Where a plain-text report stops and the copy of the original message begins.
RETURNED_MARKER = re.compile(
    r"^\s*(?:-{2,}|={2,}|\*{2,})?\s*(?:"
    r"original message|this is a copy of the message|below this line is a copy of the message"
    r"|returned message|the header of the original message is following|original message header"
    r"|undelivered message headers|message headers follow|a copy of the original message"
    r"|forwarded message|header of the original message|copy of message|the original message was received"
    r")"
    # Chinese providers: only as a separator line ("----- 原始邮件 -----"): QQ Mail's
    # "原邮件信息：" heads the summary of the original that comes before the reason
    r"|^\s*(?:-{2,}|={2,})\s*(?:原始邮件|原邮件|邮件原文|原始信件|退回的邮件)",
    re.IGNORECASE | re.MULTILINE,
)
MESSAGE_ID = re.compile(r"^Message-I[dD]:[ \t]*\r?\n?[ \t]*(<?[^\s<>]+@[^\s<>]+>?)", re.MULTILINE | re.IGNORECASE)


def parse_bytes(raw: bytes) -> Message:
    """The message, parsed leniently (compat32 never raises on a bad header)."""
    return email.message_from_bytes(raw, policy=email.policy.compat32)


def header(msg: Message, name: str) -> str:
    """A header's value as text, RFC 2047 words decoded, folding removed ('' if absent)."""
    value = msg.get(name)
    if value is None:
        return ""
    try:
        text = str(email.header.make_header(email.header.decode_header(str(value))))
    except (ValueError, LookupError, UnicodeError, email.errors.HeaderParseError):
        text = str(value)
    return re.sub(r"\s*\r?\n\s*", " ", text).strip()


def addresses(value: str) -> list[str]:
    """The lower-cased addr-specs of a header value ('rfc822; a@b' and '<a@b>' included)."""
    value = re.sub(r"(?i)\brfc822\s*;", "", value)
    out = []
    for _, addr in email.utils.getaddresses([value]):
        addr = addr.strip().strip("<>").lower()
        if "@" in addr and addr not in out:
            out.append(addr)
    return out


def payload_text(part: Message) -> str:
    """A leaf part's text: transfer-decoded, then charset-decoded (lenient)."""
    payload = part.get_payload(decode=True)
    if payload is None:
        raw = part.get_payload()
        if isinstance(raw, list):
            return "\n\n".join(p.as_string() if isinstance(p, Message) else str(p) for p in raw)
        return str(raw or "")
    if not isinstance(payload, bytes):
        return str(payload)
    return decode(payload, part.get_content_charset())


def decode(data: bytes, charset: str | None) -> str:
    for cs in (charset, "utf-8"):
        if not cs:
            continue
        try:
            return data.decode(cs)
        except (LookupError, UnicodeDecodeError):
            continue
    return data.decode("latin-1")


def message_text(part: Message) -> str:
    """A message/* part's body as text (the parser keeps message/rfc822 as a sub-message)."""
    payload = part.get_payload()
    if isinstance(payload, list):
        return "\n".join(p.as_string() if isinstance(p, Message) else str(p) for p in payload)
    if isinstance(payload, str):
        data = part.get_payload(decode=True)
        if isinstance(data, bytes):
            return decode(data, part.get_content_charset())
        return payload
    return ""


def walk_report(msg: Message) -> Iterator[Message]:
    """Every part of the report itself, never descending into a returned message."""
    yield msg
    if msg.get_content_type() in ("message/rfc822", "message/global", "text/rfc822-headers",
                                  "message/rfc822-headers"):
        return
    payload = msg.get_payload()
    if isinstance(payload, list) and msg.is_multipart():
        for sub in payload:
            if isinstance(sub, Message):
                yield from walk_report(sub)


def returned_message(msg: Message) -> Message | None:
    """The copy of the original message (message/rfc822 or text/rfc822-headers part), if any."""
    for part in walk_report(msg):
        ctype = part.get_content_type()
        if ctype in ("message/rfc822", "message/global"):
            payload = part.get_payload()
            if isinstance(payload, list) and payload and isinstance(payload[0], Message):
                return payload[0]
            if isinstance(payload, str):
                return email.message_from_string(payload, policy=email.policy.compat32)
        if ctype in ("text/rfc822-headers", "message/rfc822-headers", "message/global-headers"):
            return email.message_from_string(payload_text(part) + "\n\n", policy=email.policy.compat32)
    return None


def report_texts(msg: Message) -> list[str]:
    """The human-readable text parts of the report (text/plain, else text/html stripped)."""
    plain, html = [], []
    for part in walk_report(msg):
        if part.is_multipart():
            continue
        ctype = part.get_content_type()
        if ctype == "text/plain":
            plain.append(payload_text(part))
        elif part.get_content_maintype() == "multipart":
            plain += _unparsed_multipart(str(part.get_payload()))
        elif ctype == "text/html":
            html.append(strip_html(payload_text(part)))
    return plain or html


def _unparsed_multipart(payload: str) -> list[str]:
    """Text parts of a multipart whose boundary parameter was lost (a folded
    Content-Type continued without white space): split on '--' lines by hand."""
    out = []
    for chunk in re.split(r"(?m)^--\S+[ \t]*$", payload):
        head, sep, body = chunk.lstrip("\r\n").partition("\n\n")
        if not sep:
            continue
        lowered = head.lower()
        if "content-type" in lowered and "text/plain" not in lowered:
            continue
        if "quoted-printable" in lowered:
            body = quopri.decodestring(body.encode("latin-1", "replace")).decode("utf-8", "replace")
        out.append(body)
    return out


def strip_html(text: str) -> str:
    text = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", text)
    text = re.sub(r"(?i)<br\s*/?>|</p>|</div>|</tr>|</li>", "\n", text)
    text = re.sub(r"<[^>]+>", " ", text)
    for entity, char in (("&nbsp;", " "), ("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&#39;", "'"),
                         ("&amp;", "&")):
        text = text.replace(entity, char)
    return text


def split_returned(text: str) -> tuple[str, str]:
    """(report part, returned-message part) of a plain-text report."""
    m = RETURNED_MARKER.search(text)
    if m:
        return text[:m.start()], text[m.start():]
    # A returned header block without a marker: "Received:" lines after a blank line.
    m = re.search(r"\n\s*\n((?:Return-Path|Received|Delivered-To|X-[\w-]+): )", text)
    if m:
        return text[:m.start(1)], text[m.start(1):]
    return text, ""


def normalize_message_id(value: str | None) -> str | None:
    if not value:
        return None
    value = value.strip()
    m = re.search(r"<([^<>\s]+)>", value)
    inner = m.group(1) if m else value.split()[0] if value.split() else ""
    return f"<{inner}>" if "@" in inner else None


def message_id_in(text: str) -> str | None:
    m = MESSAGE_ID.search(text or "")
    return normalize_message_id(m.group(1)) if m else None
