"""Classify one message found in a bounce mailbox: what happened to which recipient.

``parse(raw)`` returns a :class:`Report` whose :meth:`Report.as_json` is what
``mailq-db bounces parse FILE --json`` prints.  The order of the checks is the
order in which the formats can be told apart without doubt (docs/bounces.md):

1. ARF feedback reports (RFC 5965), Hotmail JMRP and Amazon SES notifications
   (JSON in an SNS e-mail): complaints, or bounces with their own fields.
2. MDNs (RFC 8098, ``report-type=disposition-notification``): read receipts.
3. SMTP TLS reports (RFC 8460) and challenge-response requests: not bounces,
   even when dressed as a delivery-status report.
4. DSNs (RFC 3464, RFC 6533), wherever the ``message/delivery-status`` part
   sits, or as bare fields when a broken boundary left them in a text part.
5. Plain-text bounces (qmail, Exim, Gmail, Yahoo, Domino, Chinese providers):
   recognised by the sender and subject of a mailer daemon; the recipients
   come from X-Failed-Recipients, flufl.bounce's detectors and the report's
   text, the codes from the text next to each recipient.
6. Auto-replies (RFC 3834 ``Auto-Submitted: auto-replied``, or the subjects
   and headers of Exchange, Notes and friends): never a bounce.  Checked after
   the bounces on purpose: Exim marks its own bounces ``auto-replied``.
7. Everything else: not-bounce.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

from . import dsn, mime, rules
from .text import plain_text_recipients

KINDS = ("hard", "soft", "delayed", "complaint", "autoreply", "mdn", "not-bounce")

AUTOREPLY_SUBJECT = re.compile(
    r"^\s*(?:\[?\s*)?(?:automatic reply|auto(?:matic)?[- ]?(?:reply|response|antwort)|autoreply|auto:"
    r"|out of (?:the )?office|abwesenheitsnotiz|abwesend|automatyczna odpowied|respuesta autom[aá]tica"
    r"|r[ée]ponse automatique|risposta automatica|automatisch antwoord|autosvar|vacation"
    r"|自动回复|自動回覆|自動返信|自動応答)",
    re.IGNORECASE,
)
BOUNCE_SENDER = re.compile(
    r"mailer[-_]?daemon|postmaster|post_master|mail delivery (?:subsystem|system)|mail administrator"
    r"|deliverystatus|bounce|系统退信|系統退信|退信",
    re.IGNORECASE,
)
BOUNCE_SUBJECT = re.compile(
    r"undeliver|undelivered|delivery status notification|failure notice|delivery failure|mail delivery failed"
    r"|returned mail|delivery (?:has )?failed|could not be delivered|non[- ]?delivery|not delivered"
    r"|delivery report|delivery problem|message delayed|delayed mail|delivery delayed|warning: message"
    r"|DELIVERY FAILURE|mail system error|nondeliverable|系统退信|退信|投递失败|发送失败|未能送达|無法投遞",
    re.IGNORECASE,
)
CHALLENGE = re.compile(
    r"guest list|pre-?approved|protected by (?:bluebottle|spam ?arrest|boxbe)|challenge[- ]response"
    r"|sender verification|verify (?:that )?you are (?:a )?(?:real )?(?:person|human)|add yourself to my"
    r"|waitlist|please click (?:on )?the link below to (?:verify|confirm|deliver)|prove you are human",
    re.IGNORECASE,
)


@dataclass
class Recipient:
    address: str
    action: str  # failed | delayed | delivered | relayed | expanded
    status: str | None  # the enhanced status code, e.g. 5.1.1
    kind: str  # hard | soft | delayed | delivered (per recipient), or complaint / mdn
    diagnostic: str | None = None
    #: taken from the returned message's headers, not from the report's fields
    guessed: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"address": self.address, "action": self.action, "status": self.status}


@dataclass
class Report:
    kind: str
    recipients: list[Recipient] = field(default_factory=list)
    original_message_id: str | None = None
    #: the report's own Message-ID (the reader's idempotency key when present)
    message_id: str | None = None
    #: where the report was delivered (Delivered-To, X-Original-To, To, ...): a
    #: VERP address names the mail and recipient it is about
    delivered_to: list[str] = field(default_factory=list)
    #: the returned message's Return-Path addresses and X-Mailq-Token values:
    #: where a complaint or a relay that rewrote the envelope keeps the token
    returned_tokens: list[str] = field(default_factory=list)
    format: str = "none"  # arf, jmrp, ses, mdn, dsn, text, autoreply, tlsrpt, challenge, none
    feedback_type: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "recipients": [r.as_json() for r in self.recipients],
                "original_message_id": self.original_message_id}

    def dumps(self) -> str:
        return json.dumps(self.as_json(), ensure_ascii=False)


def parse(raw: bytes) -> Report:
    """Classify one raw RFC 5322 message (see the module's docstring for the order)."""
    msg = mime.parse_bytes(raw)
    report = _classify(msg)
    report.message_id = mime.normalize_message_id(mime.header(msg, "Message-ID"))
    report.delivered_to = _delivered_to(msg)
    report.returned_tokens = _returned_tokens(msg)
    if report.original_message_id is None and report.kind not in ("autoreply", "not-bounce"):
        report.original_message_id = _original_id_fallback(msg)
    return report


def _classify(msg: Message) -> Report:
    for check in (_feedback, _jmrp, _ses, _mdn, _not_a_report, _dsn, _plain_text, _autoreply):
        report = check(msg)
        if report is not None:
            return report
    return Report("not-bounce")


def _report_type(msg: Message) -> str:
    for part in mime.walk_report(msg):
        if part.get_content_type() == "multipart/report":
            return str(part.get_param("report-type") or "").lower()
    return ""


def _parts(msg: Message, *types: str) -> list[Message]:
    return [p for p in mime.walk_report(msg) if p.get_content_type() in types]


def _returned_id(msg: Message) -> str | None:
    returned = mime.returned_message(msg)
    if returned is not None:
        return mime.normalize_message_id(mime.header(returned, "Message-ID"))
    return None


def _original_id_fallback(msg: Message) -> str | None:
    """The original Message-ID from a returned copy in the text, else In-Reply-To/References."""
    found = _returned_id(msg)
    if found:
        return found
    for text in mime.report_texts(msg):
        _, returned = mime.split_returned(text)
        found = mime.message_id_in(returned)
        if found:
            return found
    for name in ("In-Reply-To", "References"):
        found = mime.normalize_message_id(mime.header(msg, name))
        if found:
            return found
    return None


def _delivered_to(msg: Message) -> list[str]:
    out: list[str] = []
    for name in ("Delivered-To", "X-Original-To", "Envelope-To", "X-Envelope-To", "To"):
        for value in msg.get_all(name) or []:
            for addr in mime.addresses(str(value)):
                if addr not in out:
                    out.append(addr)
    return out


TOKEN_HEADER = "X-Mailq-Token"
RETURNED_TOKEN = re.compile(r"^(?:Return-Path:[ \t]*<([^<>\s]+)>|X-Mailq-Token:[ \t]*([A-Za-z2-7]+))[ \t]*$",
                            re.IGNORECASE | re.MULTILINE)


def _returned_tokens(msg: Message) -> list[str]:
    """Return-Path addresses and X-Mailq-Token values of the returned message
    (a message/rfc822 or headers part, or the copy inside a plain-text report)."""
    out: list[str] = []
    returned = mime.returned_message(msg)
    if returned is not None:
        for value in (returned.get_all("Return-Path") or []) + (returned.get_all(TOKEN_HEADER) or []):
            out += mime.addresses(str(value)) or [str(value).strip()]
    for text in mime.report_texts(msg):
        for m in RETURNED_TOKEN.finditer(mime.split_returned(text)[1]):
            out.append((m.group(1) or m.group(2)).lower())
    return [t for i, t in enumerate(out) if t and t not in out[:i]]


# ---------------------------------------------------------------- complaints


def _feedback(msg: Message) -> Report | None:
    """ARF (RFC 5965): a message/feedback-report part."""
    parts = _parts(msg, "message/feedback-report")
    if not parts and _report_type(msg) != "feedback-report":
        return None
    values = dsn.group_fields(mime.message_text(parts[0])) if parts else {}
    returned = mime.returned_message(msg)
    candidates = [values.get("original-rcpt-to", ""), values.get("removal-recipient", "")]
    address = next((a[0] for a in (mime.addresses(c) for c in candidates) if len(a) == 1), None)
    guessed = False
    if address is None and returned is not None:
        # No Original-Rcpt-To (RFC 5965 makes it optional; Yahoo and others
        # omit it): the returned To and Cc, when they name exactly one address.
        # Only a guess: a Bcc recipient of the mail complains too (the reader
        # drops it when the token says the mail had several recipients).
        shown = mime.addresses(mime.header(returned, "To") + ", " + mime.header(returned, "Cc"))
        address, guessed = (shown[0], True) if len(shown) == 1 else (None, False)
    recipients = [Recipient(address, "delivered", None, "complaint", guessed=guessed)] if address else []
    return Report("complaint", recipients, _returned_id(msg), format="arf",
                  feedback_type=(values.get("feedback-type") or "abuse").lower())


def _jmrp(msg: Message) -> Report | None:
    """Hotmail/Outlook.com JMRP: the complained-about message, with X-HmXmrOriginalRecipient."""
    returned = mime.returned_message(msg)
    if returned is None or not returned.get("X-HmXmrOriginalRecipient"):
        return None
    found = mime.addresses(mime.header(returned, "X-HmXmrOriginalRecipient"))
    recipients = [Recipient(found[0], "delivered", None, "complaint")] if found else []
    return Report("complaint", recipients, mime.normalize_message_id(mime.header(returned, "Message-ID")),
                  format="jmrp", feedback_type="abuse")


def _ses(msg: Message) -> Report | None:
    """Amazon SES bounce/complaint notifications delivered by SNS as e-mail (JSON body)."""
    for text in mime.report_texts(msg):
        body = text.strip()
        if not body.startswith("{"):
            continue
        # SNS appends an unsubscribe footer after the JSON and may wrap its
        # lines inside strings: decode the first JSON value, control characters allowed.
        decoder = json.JSONDecoder(strict=False)
        try:
            data, _ = decoder.raw_decode(body)
            if isinstance(data, dict) and isinstance(data.get("Message"), str):  # SNS envelope
                data, _ = decoder.raw_decode(data["Message"].strip())
        except ValueError:
            continue
        kind = isinstance(data, dict) and (data.get("notificationType") or data.get("eventType"))
        if kind in ("Bounce", "Complaint"):
            return _ses_report(data, kind)
    return None


def _ses_report(data: dict[str, Any], kind: str) -> Report:
    mail = data.get("mail") or {}
    headers = {h.get("name", "").lower(): h.get("value") for h in mail.get("headers") or [] if isinstance(h, dict)}
    original = mime.normalize_message_id(headers.get("message-id"))
    if kind == "Complaint":
        c = data.get("complaint") or {}
        recipients = [Recipient(r["emailAddress"].lower(), "delivered", None, "complaint")
                      for r in c.get("complainedRecipients") or [] if r.get("emailAddress")]
        return Report("complaint", recipients, original, format="ses",
                      feedback_type=c.get("complaintFeedbackType") or "abuse")
    b = data.get("bounce") or {}
    permanent = b.get("bounceType") == "Permanent"
    recipients = []
    for r in b.get("bouncedRecipients") or []:
        if not r.get("emailAddress"):
            continue
        status = rules.clean_status(r.get("status"))
        diag = r.get("diagnosticCode")
        action = (r.get("action") or "failed").lower()
        kind_r = rules.recipient_kind(action, status, diag) if permanent else "soft"
        recipients.append(Recipient(mime.addresses(r["emailAddress"])[0], action, status, kind_r, diag))
    return Report(rules.worst([r.kind for r in recipients]) or ("hard" if permanent else "soft"),
                  recipients, original, format="ses")


# ---------------------------------------------------------------- MDN, not-a-report


def _mdn(msg: Message) -> Report | None:
    parts = _parts(msg, "message/disposition-notification", "message/global-disposition-notification")
    if not parts and _report_type(msg) != "disposition-notification":
        return None
    values = dsn.group_fields(mime.message_text(parts[0])) if parts else {}
    found = mime.addresses(values.get("final-recipient", "") or values.get("original-recipient", ""))
    recipients = [Recipient(found[0], "delivered", None, "mdn")] if found else []
    original = mime.normalize_message_id(values.get("original-message-id"))
    return Report("mdn", recipients, original or mime.normalize_message_id(mime.header(msg, "In-Reply-To")),
                  format="mdn")


def _not_a_report(msg: Message) -> Report | None:
    """SMTP TLS reports and challenge-response requests (even dressed as a DSN)."""
    if _report_type(msg) == "tlsrpt" or msg.get("TLS-Report-Domain") or msg.get("TLS-Report-Submitter"):
        return Report("not-bounce", format="tlsrpt")
    texts = " ".join(mime.report_texts(msg))
    diagnostics = " ".join(r.diagnostic or "" for r in _dsn_recipients(msg))
    if CHALLENGE.search(texts) or CHALLENGE.search(diagnostics) or "boxbe" in diagnostics.lower():
        return Report("not-bounce", format="challenge")
    return None


# ---------------------------------------------------------------- DSN


def _dsn_recipients(msg: Message) -> list[dsn.DsnRecipient]:
    found: list[dsn.DsnRecipient] = []
    for part in _parts(msg, "message/delivery-status", "message/global-delivery-status"):
        found += dsn.recipients(mime.message_text(part))
    if not found and _report_type(msg) == "delivery-status":
        # a broken boundary left the fields inside a text part (RFC 3464 example in the wild)
        for text in mime.report_texts(msg):
            found += dsn.recipients(text)
    return found


def _dsn(msg: Message) -> Report | None:
    found = _dsn_recipients(msg)
    if not found:
        return None
    recipients: list[Recipient] = []
    seen: set[str] = set()
    for r in found:
        address = r.address or ""
        if address in seen:
            continue
        seen.add(address)
        one = rules.recipient_kind(r.action, r.status, r.diagnostic)
        status = r.status if one == "delivered" else rules.specific_code(r.status, r.diagnostic)
        action = r.action if r.action in rules.ACTIONS else _action_for(one)
        recipients.append(Recipient(address, action or "failed", status, one, r.diagnostic))
    kind = rules.worst([r.kind for r in recipients])
    return Report("not-bounce" if kind == "delivered" else kind or "not-bounce", recipients,
                  _returned_id(msg), format="dsn")


def _action_for(kind: str) -> str:
    return {"delayed": "delayed", "delivered": "delivered"}.get(kind, "failed")


# ---------------------------------------------------------------- plain text, auto-replies


def looks_like_bounce(msg: Message) -> bool:
    """From a mailer daemon or postmaster, a failure subject, or X-Failed-Recipients."""
    if msg.get("X-Failed-Recipients"):
        return True
    sender = mime.header(msg, "From")
    subject = mime.header(msg, "Subject")
    if AUTOREPLY_SUBJECT.search(subject):
        return False
    if BOUNCE_SUBJECT.search(subject):
        return bool(BOUNCE_SENDER.search(sender) or mime.header(msg, "Return-Path") in ("<>", ""))
    if not BOUNCE_SENDER.search(sender):
        return False
    report = "\n".join(mime.split_returned(t)[0] for t in mime.report_texts(msg))
    return any(p.search(report) for p in (rules.PERMANENT_TEXT, rules.HARD_TEXT, rules.DELAY_TEXT,
                                          rules.FULL_TEXT))


def _plain_text(msg: Message) -> Report | None:
    if not looks_like_bounce(msg):
        return None
    recipients = plain_text_recipients(msg)
    if not recipients:
        # A bounce that names nobody (some relays strip it): its kind from the
        # words; the reader takes the recipient from the signed VERP token.
        # The report's own words only: the returned copy of our mail may say anything.
        text = mime.header(msg, "Subject") + "\n" + "\n".join(mime.split_returned(t)[0] for t in mime.report_texts(msg))
        if rules.DELAY_TEXT.search(text) and not rules.PERMANENT_TEXT.search(text):
            return Report("delayed", format="text")
        return Report(rules.failed_kind(None, text), format="text")
    out = [Recipient(a, _action_for(k), s, k, d) for a, s, k, d in recipients]
    return Report(rules.worst([r.kind for r in out]) or "soft", out, _returned_id(msg), format="text")


def _autoreply(msg: Message) -> Report | None:
    auto = mime.header(msg, "Auto-Submitted").lower()
    subject = mime.header(msg, "Subject")
    precedence = mime.header(msg, "Precedence").lower()
    if (auto.startswith("auto-replied") or msg.get("X-Autoreply") or msg.get("X-Autorespond")
            or msg.get("X-Auto-Response-Suppress") and AUTOREPLY_SUBJECT.search(subject)
            or precedence == "auto_reply" or AUTOREPLY_SUBJECT.search(subject)):
        return Report("autoreply", format="autoreply")
    return None
