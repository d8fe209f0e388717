"""Turn SMTP outcomes into Retry, Wait or Stop, with a scope.

The verdicts come from a rule table shipped as data beside this module,
``smtp_rules.toml`` (each rule names the public document it comes from), and are
documented in ``docs/smtp-classification.md``, whose rule listing is generated
from the table (``python -m mailq_db.worker.classify --update-doc
docs/smtp-classification.md``).

* **Retry** - transient trouble: the attempt is consumed and the database
  schedules the next one with backoff (or ``retry_after_seconds``).
* **Wait** - the account is throttled, locked, misconfigured or unreachable:
  the account is blocked until ``retry_after_seconds`` from now and the
  attempt is refunded.  A Wait is always account-wide.
* **Stop** - permanent: the recipient (or the whole mail) is failed at once.

The **scope** says what the verdict is about, and so what the worker does:

* ``recipient`` - this recipient only (a reply to RCPT): retry or drop that
  recipient, the mail goes on to the others;
* ``mail`` - this mail (a reply to MAIL FROM, DATA or the final dot);
* ``sender`` - the mail's sender address (its From): a Stop fails this mail,
  a Retry pauses that From address; never the whole account;
* ``account`` - every mail of the account: block the account (Wait);
* ``connection`` - this SMTP session: close it, reconnect, and send the mail
  again on the new session (no account block).

Stages: ``connect`` (greeting), ``ehlo``, ``starttls``, ``auth``, ``mail``
(MAIL FROM), ``rcpt`` (RCPT TO), ``data`` (reply to DATA), ``dot`` (reply after
the final dot), ``rset``, ``quit``.  ``data`` and ``dot`` match the same rules:
``data`` used to mean the final reply and stays accepted for it.

:class:`Escalation` is the small stateful part: repeated temporary failures
of one account become a Wait, and a Wait that keeps coming back is lengthened.
"""

from __future__ import annotations

import logging
import re
import smtplib
import socket
import ssl
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Callable, Iterable, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

log = logging.getLogger(__name__)

RETRY, WAIT, STOP = "Retry", "Wait", "Stop"
DISPOSITIONS = (RETRY, WAIT, STOP)
RECIPIENT, MAIL, SENDER, ACCOUNT, CONNECTION = "recipient", "mail", "sender", "account", "connection"
SCOPES = (RECIPIENT, MAIL, SENDER, ACCOUNT, CONNECTION)
#: Which scopes each disposition may have (the loader refuses the others).
ALLOWED_SCOPES = {WAIT: (ACCOUNT,), STOP: (RECIPIENT, MAIL, SENDER),
                  RETRY: (RECIPIENT, MAIL, SENDER, CONNECTION)}
STAGES = ("connect", "ehlo", "starttls", "auth", "mail", "rcpt", "data", "dot", "rset", "quit")
#: Stages before any mail: a refusal there means the account cannot send at all.
SESSION_STAGES = ("connect", "ehlo", "starttls", "auth")
MAIL_STAGES = ("mail", "rcpt", "data", "dot")
#: Wait, in seconds, when a rule that is coerced to a Wait named none.
DEFAULT_WAIT_SECONDS = 300

RULES_RESOURCE = "smtp_rules.toml"
TIERS = ("rule", "subject", "class")


class SetupError(smtplib.SMTPException):
    """The server cannot serve the account as configured (e.g. STARTTLS not offered)."""


class NeedsSmtpUtf8(smtplib.SMTPException):
    """A non-ASCII address, and the server does not offer SMTPUTF8."""


class RuleTableError(ValueError):
    """The rule table is invalid; the message names the rule and the key."""


# --------------------------------------------------------------------------- outcome


@dataclass(frozen=True)
class Outcome:
    """What to do: the disposition, why, which rule decided, how long, and the scope.

    ``scope`` defaults from the disposition (Wait: account, otherwise mail) so
    outcomes built by hand stay valid.
    """

    disposition: str
    reason: str
    rule: str
    smtp_code: int | None = None
    retry_after_seconds: int | None = None
    scope: str = ""
    source: str | None = None

    def __post_init__(self) -> None:
        if not self.scope:
            object.__setattr__(self, "scope", ACCOUNT if self.disposition == WAIT else MAIL)

    @property
    def account_wide(self) -> bool:
        """A Wait blocks the account: the rest of its batch is given back the same way."""
        return self.disposition == WAIT


# --------------------------------------------------------------------------- rule table


@dataclass(frozen=True)
class Provider:
    id: str
    hosts: tuple[re.Pattern[str], ...] = ()
    text: tuple[re.Pattern[str], ...] = ()
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class StatusPattern:
    """``5.7.1``, ``x.7.1`` (either class), ``x.7`` (subject), ``5.7.700-749`` (detail range)."""

    klass: int | None
    subject: int
    detail: tuple[int, int] | None

    def matches(self, status: tuple[int, int, int] | None) -> bool:
        if status is None:
            return False
        klass, subject, detail = status
        if self.klass is not None and klass != self.klass:
            return False
        if subject != self.subject:
            return False
        return self.detail is None or self.detail[0] <= detail <= self.detail[1]


@dataclass(frozen=True)
class Rule:
    id: str
    tier: str
    disposition: str
    scope: str
    source: str
    why: str = ""
    stages: tuple[str, ...] = ()
    codes: tuple[str, ...] = ()
    status: tuple[StatusPattern, ...] = ()
    providers: tuple[str, ...] = ()
    text: re.Pattern[str] | None = None
    not_text: re.Pattern[str] | None = None
    wait: int | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def matches(self, code: int, stage: str, status: tuple[int, int, int] | None,
                provider: str | None, message: str) -> bool:
        if self.stages and stage not in self.stages:
            return False
        if self.codes and not any(_code_matches(p, code) for p in self.codes):
            return False
        if self.status and not any(p.matches(status) for p in self.status):
            return False
        if self.providers and provider not in self.providers:
            return False
        if self.text is not None and not self.text.search(message):
            return False
        return self.not_text is None or not self.not_text.search(message)


@dataclass(frozen=True)
class RuleTable:
    providers: Mapping[str, Provider]
    rules: tuple[Rule, ...]

    def by_id(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)


_RULE_KEYS = {"id", "stages", "codes", "status", "providers", "text", "not_text", "text_of",
              "disposition", "scope", "wait", "source", "why"}
_PROVIDER_KEYS = {"hosts", "text", "aliases"}
_TOP_KEYS = {"version", "providers", *TIERS}
_CODE_PATTERN = re.compile(r"^[2-5](?:[0-9]{2}|[0-9]x|xx)$")
_STATUS_PATTERN = re.compile(r"^(x|[245])\.(\d{1,3})(?:\.(\d{1,3})(?:-(\d{1,3}))?)?$")


def _code_matches(pattern: str, code: int) -> bool:
    text = f"{code:03d}"
    return len(text) == 3 and all(p in ("x", c) for p, c in zip(pattern, text, strict=True))


def _compile(where: str, key: str, pattern: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str) or not pattern:
        raise RuleTableError(f"{where}: {key!r} must be a non-empty regular expression string")
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise RuleTableError(f"{where}: bad regular expression in {key!r} ({exc}): {pattern!r}") from None


def _strings(where: str, key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleTableError(f"{where}: {key!r} must be a list of strings")
    return value


def _parse_status(where: str, text: str) -> StatusPattern:
    m = _STATUS_PATTERN.match(text)
    if not m:
        raise RuleTableError(f"{where}: bad enhanced status pattern {text!r} "
                             "(expected e.g. '5.7.1', 'x.7.1', 'x.7', '5.7.700-749')")
    klass = None if m.group(1) == "x" else int(m.group(1))
    detail = None
    if m.group(3) is not None:
        low = int(m.group(3))
        high = int(m.group(4)) if m.group(4) is not None else low
        if high < low:
            raise RuleTableError(f"{where}: empty detail range in {text!r}")
        detail = (low, high)
    return StatusPattern(klass, int(m.group(2)), detail)


def _rule_where(tier: str, index: int, data: Any) -> str:
    where = f"[[{tier}]] #{index + 1}"
    if not isinstance(data, dict):
        raise RuleTableError(f"{where}: must be a table")
    return f"[[{tier}]] {data['id']!r}" if isinstance(data.get("id"), str) else where


def _rule_verdict(where: str, data: dict[str, Any]) -> tuple[str, str]:
    """The checked (disposition, scope) of a rule, after its required keys."""
    unknown = sorted(set(data) - _RULE_KEYS)
    if unknown:
        raise RuleTableError(f"{where}: unknown key(s) {', '.join(unknown)} "
                             f"(allowed: {', '.join(sorted(_RULE_KEYS))})")
    for key in ("id", "disposition", "scope", "source"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise RuleTableError(f"{where}: {key!r} is required (a non-empty string)")
    disposition, scope = data["disposition"], data["scope"]
    if disposition not in DISPOSITIONS:
        raise RuleTableError(f"{where}: disposition {disposition!r} is not one of {', '.join(DISPOSITIONS)}")
    if scope not in SCOPES:
        raise RuleTableError(f"{where}: scope {scope!r} is not one of {', '.join(SCOPES)}")
    if scope not in ALLOWED_SCOPES[disposition]:
        raise RuleTableError(f"{where}: a {disposition} cannot have scope {scope!r} "
                             f"(allowed: {', '.join(ALLOWED_SCOPES[disposition])})")
    if not re.match(r"^https?://\S+$", data["source"]):
        raise RuleTableError(f"{where}: 'source' must be the URL of the public document")
    return disposition, scope


def _rule_stages(where: str, data: dict[str, Any]) -> tuple[str, ...]:
    stages = tuple(_strings(where, "stages", data.get("stages", [])))
    for stage in stages:
        if stage not in STAGES:
            raise RuleTableError(f"{where}: unknown stage {stage!r} (stages: {', '.join(STAGES)})")
    if "data" in stages or "dot" in stages:  # the alias: data and dot match alike
        stages = tuple(dict.fromkeys((*stages, "data", "dot")))
    return stages


def _rule_codes(where: str, data: dict[str, Any]) -> tuple[str, ...]:
    raw_codes = data.get("codes", [])
    if not isinstance(raw_codes, list):
        raise RuleTableError(f"{where}: 'codes' must be a list")
    codes: list[str] = []
    for code in raw_codes:
        text = str(code) if isinstance(code, int) and not isinstance(code, bool) else code
        if not isinstance(text, str) or not _CODE_PATTERN.match(text):
            raise RuleTableError(f"{where}: bad reply code {code!r} (expected e.g. 550, '5xx', '45x')")
        codes.append(text)
    return tuple(codes)


def _rule_providers(where: str, data: dict[str, Any], providers: Mapping[str, Provider]) -> tuple[str, ...]:
    names = tuple(_strings(where, "providers", data.get("providers", [])))
    for name in names:
        if name not in providers:
            raise RuleTableError(f"{where}: unknown provider {name!r} (defined: {', '.join(providers)})")
    return names


def _rule_wait(where: str, data: dict[str, Any], disposition: str) -> int | None:
    wait = data.get("wait")
    if wait is not None and (not isinstance(wait, int) or isinstance(wait, bool) or not 0 <= wait <= 86400 * 7):
        raise RuleTableError(f"{where}: 'wait' must be whole seconds between 0 and 604800")
    if disposition == WAIT and wait is None:
        raise RuleTableError(f"{where}: a Wait needs 'wait' (how long the account is blocked)")
    return wait


def _with_text_of(where: str, data: dict[str, Any], earlier: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``text_of = "<id>"``: the rule takes the text and not_text of an earlier rule (a
    4xx/5xx pair with one wording), so the two can never drift apart."""
    if "text_of" not in data:
        return data
    if "text" in data or "not_text" in data:
        raise RuleTableError(f"{where}: 'text_of' replaces 'text' and 'not_text'; give one or the other")
    source = earlier.get(data["text_of"]) if isinstance(data["text_of"], str) else None
    if source is None or "text" not in source:
        raise RuleTableError(f"{where}: 'text_of' must name an earlier rule with a 'text': {data['text_of']!r}")
    return {**{k: source[k] for k in ("text", "not_text") if k in source}, **data}


def _parse_rule(tier: str, index: int, data: Any, providers: Mapping[str, Provider],
                earlier: Mapping[str, Mapping[str, Any]]) -> Rule:
    where = _rule_where(tier, index, data)
    data = _with_text_of(where, data, earlier)
    disposition, scope = _rule_verdict(where, data)
    why = data.get("why", "")
    if not isinstance(why, str):
        raise RuleTableError(f"{where}: 'why' must be a string")
    return Rule(
        id=data["id"], tier=tier, disposition=disposition, scope=scope, source=data["source"],
        why=why, stages=_rule_stages(where, data), codes=_rule_codes(where, data),
        status=tuple(_parse_status(where, s) for s in _strings(where, "status", data.get("status", []))),
        providers=_rule_providers(where, data, providers),
        text=_compile(where, "text", data["text"]) if "text" in data else None,
        not_text=_compile(where, "not_text", data["not_text"]) if "not_text" in data else None,
        wait=_rule_wait(where, data, disposition), raw=data,
    )


def parse_rules(text: str, name: str = RULES_RESOURCE) -> RuleTable:
    """Parse and validate a rule table (TOML text); raises :class:`RuleTableError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuleTableError(f"{name}: not valid TOML: {exc}") from None
    try:
        unknown = sorted(set(data) - _TOP_KEYS)
        if unknown:
            raise RuleTableError(f"unknown top-level key(s) {', '.join(unknown)} "
                                 f"(allowed: {', '.join(sorted(_TOP_KEYS))})")
        if data.get("version") != 1:
            raise RuleTableError("'version' must be 1")
        providers: dict[str, Provider] = {}
        raw_providers = data.get("providers", {})
        if not isinstance(raw_providers, dict):
            raise RuleTableError("[providers] must be a table of tables")
        for pid, pdata in raw_providers.items():
            where = f"[providers.{pid}]"
            if not isinstance(pdata, dict):
                raise RuleTableError(f"{where}: must be a table")
            bad = sorted(set(pdata) - _PROVIDER_KEYS)
            if bad:
                raise RuleTableError(f"{where}: unknown key(s) {', '.join(bad)} "
                                     f"(allowed: {', '.join(sorted(_PROVIDER_KEYS))})")
            providers[pid] = Provider(
                pid,
                tuple(_compile(where, "hosts", p) for p in _strings(where, "hosts", pdata.get("hosts", []))),
                tuple(_compile(where, "text", p) for p in _strings(where, "text", pdata.get("text", []))),
                tuple(a.lower() for a in _strings(where, "aliases", pdata.get("aliases", []))),
            )
        rules: list[Rule] = []
        raws: dict[str, Mapping[str, Any]] = {}  # the rules so far, for text_of
        for tier in TIERS:
            entries = data.get(tier, [])
            if not isinstance(entries, list):
                raise RuleTableError(f"'{tier}' must be an array of tables ([[{tier}]])")
            for i, entry in enumerate(entries):
                rules.append(_parse_rule(tier, i, entry, providers, raws))
                raws.setdefault(rules[-1].id, rules[-1].raw)
        seen: set[str] = set()
        for rule in rules:
            if rule.id in seen:
                raise RuleTableError(f"duplicate rule id {rule.id!r}")
            seen.add(rule.id)
        if not rules or rules[-1].stages or rules[-1].codes or rules[-1].text or rules[-1].status \
                or rules[-1].providers:
            raise RuleTableError("the last [[class]] rule must match everything (no conditions)")
    except RuleTableError as exc:
        raise RuleTableError(f"{name}: {exc}") from None
    return RuleTable(providers, tuple(rules))


def load_rules() -> RuleTable:
    """The rule table shipped in the package."""
    text = resources.files(__package__).joinpath(RULES_RESOURCE).read_text(encoding="utf-8")
    return parse_rules(text)


#: The table every call uses (loaded once, at import: a broken table fails fast).
TABLE = load_rules()


# --------------------------------------------------------------------------- classification

_STATUS_RE = re.compile(r"(?<![\d.])([245])\.(\d{1,3})\.(\d{1,3})(?![\d.])")
_REPLY_RE = re.compile(r"^\s*([2-5]\d\d)(?:[ -]|$)(.*)$", re.DOTALL)


def enhanced_status(text: str) -> tuple[int, int, int] | None:
    """The first RFC 3463 enhanced status code in ``text`` (class, subject, detail)."""
    m = _STATUS_RE.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def join_lines(text: str) -> str:
    """A multi-line reply text as one line, without the enhanced status code that servers
    (e.g. Gmail) repeat at the start of every continuation line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    m = re.match(r"^([245]\.\d{1,3}\.\d{1,3})\s", lines[0])
    if m:
        lines[1:] = [line[len(m.group(1)):].strip() if line.startswith(m.group(1)) else line
                     for line in lines[1:]]
    return " ".join(" ".join(lines).split())


def split_reply(reply: str) -> tuple[int | None, str]:
    """``"550 5.1.1 No such user"`` -> ``(550, "5.1.1 No such user")``; continuation lines
    (``550-...``) joined with :func:`join_lines`."""
    lines = reply.strip().splitlines() or [""]
    m = _REPLY_RE.match(lines[0])
    if not m:
        return None, join_lines(reply)
    code = int(m.group(1))
    rest = [m.group(2).strip()]
    for line in lines[1:]:
        lm = _REPLY_RE.match(line)
        rest.append((lm.group(2) if lm and int(lm.group(1)) == code else line).strip())
    return code, join_lines("\n".join(rest))


def resolve_provider(*hints: str | None, table: RuleTable | None = None) -> str | None:
    """The provider id named or recognised in ``hints`` (a configured name, the server's
    host name, its greeting or EHLO domain), or ``None``."""
    table = table or TABLE
    for hint in hints:
        if not hint:
            continue
        low = hint.strip().lower()
        for provider in table.providers.values():
            if low == provider.id or low in provider.aliases:
                return provider.id
        tokens = [t.strip(".").lower() for t in re.split(r"[\s\[\]()<>,;]+", hint) if t.strip(".")]
        for provider in table.providers.values():
            if any(p.search(tok) for p in provider.hosts for tok in tokens):
                return provider.id
        for provider in table.providers.values():
            if any(p.search(hint) for p in provider.text):
                return provider.id
    return None


def reply_text(reply: bytes | str | None) -> str:
    """A server reply as text: bytes decoded as UTF-8 (bad bytes replaced), ``None`` as ''.
    The one decoder of the worker (session, classification, probe and logs)."""
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    return reply or ""


def _decide(code: int, stage: str, message: str, provider: str | None,
            table: RuleTable) -> Rule:
    status = enhanced_status(message)
    if status is not None and status[0] != code // 100:
        status = (code // 100, status[1], status[2])  # the reply code's class wins
    for rule in table.rules:
        if rule.matches(code, stage, status, provider, message):
            return rule
    raise AssertionError("the last [[class]] rule matches everything")  # pragma: no cover


def classify_reply(code: int, text: bytes | str | None, stage: str,
                   provider: str | None = None, *, table: RuleTable | None = None) -> Outcome:
    """Classify one SMTP reply ``code``/``text`` received at ``stage``.

    ``provider`` is a provider id or alias, or a host name / greeting / EHLO
    domain it is recognised from; without it the reply text's own markers
    (e.g. ``gsmtp``) are used.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r} (stages: {', '.join(STAGES)})")
    table = table or TABLE
    message = join_lines(reply_text(text))
    who = resolve_provider(provider, table=table) if provider else None
    who = who or resolve_provider(message, table=table)
    rule = _decide(code, stage, message, who, table)
    disposition, scope, wait, note = rule.disposition, rule.scope, rule.wait, ""
    if scope == RECIPIENT and stage != "rcpt":
        scope, note = MAIL, "; about the whole mail at this stage"
    if stage in SESSION_STAGES and disposition != WAIT and scope != CONNECTION:
        disposition, scope, wait = WAIT, ACCOUNT, wait or DEFAULT_WAIT_SECONDS
        note = "; before any mail: the account waits"
    reason = f"{code} {message}".strip() + f" (at {stage.upper()}; rule: {rule.id}{note})"
    return Outcome(disposition, reason, rule.id, code, wait, scope, rule.source)


def permanent(reason: str) -> Outcome:
    """A mail that can never be sent as stored (malformed, unsendable address)."""
    return Outcome(STOP, reason, "malformed mail", scope=MAIL)


_SEVERITY = {WAIT: 0, STOP: 1, RETRY: 2}


def _reply_outcome(exc: BaseException, stage: str, provider: str | None) -> Outcome | None:
    """The classification of the reply an smtplib exception carries, or None."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        # Every recipient refused: the most severe reply decides (a Wait beats a
        # Stop beats a Retry, so a throttled account is never charged).  The
        # worker itself handles this case recipient by recipient.
        outcomes = [classify_reply(code, text, "rcpt", provider) for code, text in exc.recipients.values()]
        return min(outcomes, key=lambda o: _SEVERITY[o.disposition])
    if isinstance(exc, smtplib.SMTPSenderRefused):
        return classify_reply(exc.smtp_code, exc.smtp_error, "mail", provider)
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return classify_reply(exc.smtp_code, exc.smtp_error, "auth", provider)
    if isinstance(exc, smtplib.SMTPResponseException):
        return classify_reply(exc.smtp_code, exc.smtp_error, stage, provider)
    return None


def _transport_outcome(exc: BaseException, where: str, account_stage: bool) -> Outcome | None:
    """TLS failures, dropped connections and timeouts, or None."""
    if isinstance(exc, (smtplib.SMTPNotSupportedError, ssl.SSLError)):
        kind = "TLS failure" if isinstance(exc, ssl.SSLError) else "not supported by the server"
        if account_stage:
            return Outcome(WAIT, f"{kind}: {exc} {where}", "account setup failed", None, 600, ACCOUNT)
        return Outcome(RETRY, f"{kind}: {exc} {where}", "transport error", scope=CONNECTION)
    if isinstance(exc, (smtplib.SMTPServerDisconnected, socket.timeout, TimeoutError, OSError)):
        kind = "timeout" if isinstance(exc, (socket.timeout, TimeoutError)) else "connection lost"
        if account_stage:
            return Outcome(WAIT, f"{kind}: {exc or type(exc).__name__} {where}",
                           "server unreachable", None, 60, ACCOUNT)
        return Outcome(RETRY, f"{kind}: {exc or type(exc).__name__} {where}",
                       "dropped connection or timeout", scope=CONNECTION)
    return None


def classify_exception(exc: BaseException, stage: str, provider: str | None = None) -> Outcome:
    """Classify an exception raised while talking to the server at ``stage``.

    Replies carried by smtplib exceptions go through :func:`classify_reply`.
    Dropped connections and timeouts: Retry (scope ``connection``) for the mail
    in flight; before any mail (``connect``/``ehlo``/``starttls``/``auth``) they
    mean the account is unreachable: Wait.  Any other exception before any mail
    is the account's configuration (e.g. a credential the mechanism cannot
    encode): Wait, never a charge to the mails of the batch.
    """
    outcome = _reply_outcome(exc, stage, provider)
    if outcome is not None:
        return outcome
    account_stage = stage in SESSION_STAGES
    where = f"(at {stage.upper()})"
    if isinstance(exc, NeedsSmtpUtf8):
        return Outcome(STOP, f"{exc} (RFC 6531); the address cannot be delivered through this account",
                       "SMTPUTF8 needed", scope=MAIL)
    if isinstance(exc, SetupError):
        return Outcome(WAIT, str(exc), "account setup failed", None, 600, ACCOUNT)
    outcome = _transport_outcome(exc, where, account_stage)
    if outcome is not None:
        return outcome
    if account_stage:
        return Outcome(WAIT, f"{type(exc).__name__}: {exc} {where}: the account's configuration cannot "
                       "be used", "account setup failed", None, 600, ACCOUNT)
    return Outcome(RETRY, f"{type(exc).__name__}: {exc} {where}", "unexpected error", scope=MAIL)


# --------------------------------------------------------------------------- escalation


@dataclass(frozen=True)
class EscalationPolicy:
    """When repeated outcomes of one account are escalated (all configurable).

    * ``retry_threshold`` temporary failures of the account's deliveries (Retry
      outcomes of scope ``mail`` or ``connection``; a recipient's or a sender
      address's Retry is not the account's) within ``retry_window_seconds``,
      with no accepted mail in between, become a Wait of
      ``retry_wait_seconds``; 0 switches this off.
    * A Wait that comes back within ``wait_memory_seconds`` after the previous
      block ended is multiplied by ``wait_growth`` per repetition, capped at
      ``wait_max_seconds``; ``wait_growth`` 1 switches this off.
    """

    retry_threshold: int = 5
    retry_window_seconds: float = 300
    retry_wait_seconds: int = 300
    wait_growth: float = 2.0
    wait_max_seconds: int = 3600
    wait_memory_seconds: float = 900

    def __post_init__(self) -> None:
        if self.retry_threshold < 0 or self.retry_window_seconds <= 0 or self.retry_wait_seconds < 1:
            raise ValueError("escalation: retry_threshold >= 0, retry_window_seconds > 0, "
                             "retry_wait_seconds >= 1")
        if self.wait_growth < 1 or self.wait_max_seconds < 1 or self.wait_memory_seconds < 0:
            raise ValueError("escalation: wait_growth >= 1, wait_max_seconds >= 1, wait_memory_seconds >= 0")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "EscalationPolicy":
        """From a config table (e.g. ``[escalation]`` of worker.toml); unknown keys are refused."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"escalation: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(known))})")
        return cls(**dict(data))


#: The scopes whose Retry outcomes count as the account's temporary failures.
ESCALATED_SCOPES = (MAIL, CONNECTION)


@dataclass
class _AccountState:
    retries: deque[float] = field(default_factory=deque)
    level: int = 0  # consecutive Waits that came back
    blocked_until: float = 0.0
    retry_logged: bool = False


class Escalation:
    """Per-account memory of outcomes; every worker thread of a process shares one.

    ``observe(account, outcome)`` returns the outcome to act on: unchanged, a
    Retry turned into a Wait (``escalated(outcome)`` is then true), or a Wait
    with a longer ``retry_after_seconds``.  ``success(account)`` (a mail
    accepted) forgets the account's history.  Each escalation is logged once
    (a WARNING when an account starts being escalated, another when its
    back-off grows), never per mail.  Thread-safe.
    """

    RULE_PREFIX = "escalation: "

    def __init__(self, policy: EscalationPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger | None = None) -> None:
        self.policy = policy or EscalationPolicy()
        self.clock = clock
        self.log = logger or log
        self._accounts: dict[str, _AccountState] = {}
        self._lock = threading.Lock()

    @classmethod
    def escalated(cls, outcome: Outcome) -> bool:
        """True for a Wait that this object made out of repeated temporary failures."""
        return outcome.rule.startswith(cls.RULE_PREFIX)

    def level(self, account: str) -> int | None:
        """How many times in a row the account's Wait came back (0: the first);
        None when nothing of the account is remembered."""
        with self._lock:
            state = self._accounts.get(account)
            return None if state is None else state.level

    def success(self, account: str) -> None:
        """A mail of ``account`` was accepted: its Retry count and Wait level start over."""
        with self._lock:
            self._accounts.pop(account, None)

    def observe(self, account: str, outcome: Outcome) -> Outcome:
        with self._lock:
            state = self._accounts.setdefault(account, _AccountState())
            now = self.clock()
            if outcome.disposition == RETRY:
                return self._retry(account, state, outcome, now)
            if outcome.disposition == WAIT:
                return self._wait(account, state, outcome, now)
            return outcome

    def _retry(self, account: str, state: _AccountState, outcome: Outcome, now: float) -> Outcome:
        policy = self.policy
        if not policy.retry_threshold or outcome.scope not in ESCALATED_SCOPES:
            return outcome
        state.retries.append(now)
        while state.retries and now - state.retries[0] > policy.retry_window_seconds:
            state.retries.popleft()
        if len(state.retries) < policy.retry_threshold:
            return outcome
        count = len(state.retries)
        state.retries.clear()
        if not state.retry_logged:
            state.retry_logged = True
            self.log.warning(
                "account %s: %d temporary failures within %ss; the account waits %ss (last: %s)",
                account, count, policy.retry_window_seconds, policy.retry_wait_seconds, outcome.reason)
        wait = replace(
            outcome, disposition=WAIT, scope=ACCOUNT, retry_after_seconds=policy.retry_wait_seconds,
            rule=f"{self.RULE_PREFIX}{count} temporary failures in {policy.retry_window_seconds:g}s",
            reason=f"{outcome.reason}; escalated: {count} temporary failures of the account within "
                   f"{policy.retry_window_seconds:g}s, the account waits")
        return self._wait(account, state, wait, now)

    def _wait(self, account: str, state: _AccountState, outcome: Outcome, now: float) -> Outcome:
        policy = self.policy
        base = outcome.retry_after_seconds or DEFAULT_WAIT_SECONDS
        came_back = bool(state.blocked_until) and now <= state.blocked_until + policy.wait_memory_seconds
        state.level = state.level + 1 if came_back else 0
        wait = min(int(base * policy.wait_growth ** state.level), max(policy.wait_max_seconds, base))
        state.blocked_until = now + wait
        if wait == base:
            return outcome
        self.log.warning("account %s: Wait came back %d time(s) in a row; back-off now %ss (was %ss): %s",
                         account, state.level, wait, base, outcome.reason)
        return replace(outcome, retry_after_seconds=wait,
                       reason=f"{outcome.reason}; back-off lengthened to {wait}s "
                              f"(Wait #{state.level + 1} in a row)")


# --------------------------------------------------------------------------- documentation

DOC_BEGIN = "<!-- BEGIN GENERATED RULES (python -m mailq_db.worker.classify --update-doc) -->"
DOC_END = "<!-- END GENERATED RULES -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def rules_markdown(table: RuleTable | None = None) -> str:
    """The rule listing of docs/smtp-classification.md, generated from the table."""
    table = table or TABLE
    out = []
    titles = {"rule": "Rules", "subject": "RFC 3463 subject fallbacks", "class": "Reply-code class fallbacks"}
    for tier in TIERS:
        out += [f"### {titles[tier]}", "",
                "| # | rule | stages | codes / status | providers | text | verdict | wait | why (source) |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for n, rule in enumerate((r for r in table.rules if r.tier == tier), 1):
            stages = ", ".join(s for s in rule.raw.get("stages", [])) or "any"
            match = ", ".join([*rule.codes, *rule.raw.get("status", [])]) or "any"
            text = f"`{_cell(rule.raw['text'])}`" if "text" in rule.raw else "any"
            if "not_text" in rule.raw:
                text += f" but not `{_cell(rule.raw['not_text'])}`"
            wait = f"{rule.wait} s" if rule.wait is not None else "backoff"
            out.append(f"| {n} | `{rule.id}` | {stages} | {match} | {', '.join(rule.providers) or 'any'} | "
                       f"{text} | {rule.disposition} {rule.scope} | {wait} | {_cell(rule.why)} ([source]({rule.source})) |")
        out.append("")
    out += ["### Providers", "", "| provider | recognised from host names | or reply markers | aliases |",
            "| --- | --- | --- | --- |"]
    for p in table.providers.values():
        out.append(f"| `{p.id}` | {', '.join(f'`{_cell(h.pattern)}`' for h in p.hosts) or '-'} | "
                   f"{', '.join(f'`{_cell(t.pattern)}`' for t in p.text) or '-'} | {', '.join(p.aliases) or '-'} |")
    return "\n".join(out).rstrip() + "\n"


def update_doc(text: str, table: RuleTable | None = None) -> str:
    """``text`` (the doc page) with the generated section between the markers replaced."""
    start, end = text.index(DOC_BEGIN) + len(DOC_BEGIN), text.index(DOC_END)
    return text[:start] + "\n\n" + rules_markdown(table) + "\n" + text[end:]


def _main(argv: Iterable[str]) -> int:  # pragma: no cover - a maintenance helper
    args = list(argv)
    if args[:1] == ["--markdown"]:
        sys.stdout.write(rules_markdown())
        return 0
    if len(args) == 2 and args[0] == "--update-doc":
        with open(args[1], encoding="utf-8") as fh:
            text = fh.read()
        with open(args[1], "w", encoding="utf-8") as fh:
            fh.write(update_doc(text))
        return 0
    print("usage: python -m mailq_db.worker.classify --markdown | --update-doc PATH", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main(sys.argv[1:]))
