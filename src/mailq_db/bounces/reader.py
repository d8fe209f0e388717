"""The bounce mailbox reader: IMAP in, mailq.RecordBounce / RecordUnsubscribe out.

One pass (:func:`run_once`) over the messages of the configured folder:

1. fetch a message without marking it seen (``BODY.PEEK[]``);
2. classify it (:func:`mailq_db.bounces.parse.parse`) and find its signed
   token (VERP address it was delivered to, or the returned message's
   Return-Path / X-Mailq-Token);
3. an unsubscribe token (the mailto: of List-Unsubscribe) records an
   unsubscribe; a bounce or complaint records its recipients through
   mailq.RecordBounce, keyed by the report's Message-ID (re-reading records
   nothing new); auto-replies, read receipts and other mail record nothing;
4. only then move it: to ``processed_folder`` when something was recorded,
   to ``other_folder`` when there was nothing to record.  IMAP MOVE (RFC
   6851) where offered, else COPY, STORE \\Deleted and UID EXPUNGE (RFC 4315)
   or EXPUNGE.  A message whose recording failed stays where it is and is
   read again next pass: nothing is ever deleted unrecorded.

TLS: IMAPS (``tls = "implicit"``, port 993) or STARTTLS (port 143), with
certificate checks; ``tls = "none"`` needs ``allow_plaintext``.  The password
comes from the environment (``password_env``).  OAuth2 (``auth = "xoauth2"``)
takes a bearer token from a :data:`TokenProvider` -- by default the
variable named by ``token_env``; the token providers of the worker's OAuth2
support plug in here (docs/bounces.md).
"""

from __future__ import annotations

import hashlib
import imaplib
import logging
import re
import ssl
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..errors import ConfigurationError, DatabaseError
from . import verp
from .parse import Report, parse

log = logging.getLogger("mailq_db.bounces")

#: A callable returning a fresh OAuth2 access token for the IMAP user.
TokenProvider = Callable[[], str]

KIND_TO_DB = {"hard": "Hard", "soft": "Soft", "delayed": "Delayed", "complaint": "Complaint"}
BASIC_CODE = re.compile(r"(?<![\d.])([245]\d\d)(?=[\s:-])")


@dataclass(frozen=True)
class ReaderConfig:
    host: str
    user: str
    account: str  # the sending account this mailbox serves (reports without a known mail)
    port: int = 993
    tls: str = "implicit"  # implicit | starttls | none
    allow_plaintext: bool = False
    password: str | None = field(default=None, repr=False)
    auth: str = "password"  # password | xoauth2
    token_env: str | None = None
    ca_file: str | None = None
    verify_tls: bool = True
    folder: str = "INBOX"
    processed_folder: str = "mailq-processed"
    other_folder: str = "mailq-other"
    max_messages: int = 500
    timeout_seconds: float = 30.0
    hard_bounce_limit: int = 1
    soft_bounce_limit: int | None = None
    keys: tuple[bytes, ...] = field(default=(), repr=False)

    @property
    def source(self) -> str:
        return f"imap:{self.user}@{self.host}/{self.folder}"[:200]


READER_KEYS = ("host", "port", "tls", "allow_plaintext", "user", "password_env", "auth", "token_env", "ca_file",
               "verify_tls", "folder", "processed_folder", "other_folder", "max_messages", "timeout_seconds",
               "account", "hard_bounce_limit", "soft_bounce_limit", "key_env", "key_file", "previous_key_env")


def _checked(raw: dict[str, Any], env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    problems = [f"bounces.{k}: unknown setting (expected one of {', '.join(READER_KEYS)})"
                for k in raw if k not in READER_KEYS]
    for key in ("host", "user", "account"):
        if not isinstance(raw.get(key), str) or not raw.get(key):
            problems.append(f"bounces.{key}: is required")
    tls = raw.get("tls", "implicit")
    if tls not in ("implicit", "starttls", "none"):
        problems.append(f'bounces.tls: must be "implicit" (IMAPS, 993), "starttls" (143) or "none", got {tls!r}')
    if tls == "none" and not raw.get("allow_plaintext"):
        problems.append('bounces.tls: "none" sends the password in clear text: add allow_plaintext = true '
                        "if you really mean it (a local test server only)")
    auth = raw.get("auth", "password")
    secret_env = raw.get("token_env") if auth == "xoauth2" else raw.get("password_env")
    if auth not in ("password", "xoauth2"):
        problems.append(f'bounces.auth: must be "password" or "xoauth2", got {auth!r}')
    elif not secret_env:
        problems.append(f"bounces.{'token_env' if auth == 'xoauth2' else 'password_env'}: name the environment "
                        "variable that holds the secret (secrets never go in the file)")
    elif secret_env not in env:
        problems.append(f"bounces: environment variable {secret_env} is not set")
    for key in ("hard_bounce_limit", "soft_bounce_limit"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, int) or not 0 <= value <= 100):
            problems.append(f"bounces.{key}: must be 1-100 (soft_bounce_limit 0: never), got {value!r}")
    if raw.get("password") is not None:
        problems.append("bounces.password: passwords never go in the file: set password_env")
    return raw, problems


def parse_reader_config(text: str, *, env: Mapping[str, str], source: str = "config") -> ReaderConfig:
    """``[bounces]`` of a TOML file; raises ConfigurationError listing every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{source} is not valid TOML: {exc}") from exc
    raw = dict(data.get("bounces") or {})
    raw, problems = _checked(raw, env)
    keys: list[bytes] = []
    try:
        keys = verp.load_keys(env, raw.get("key_env") or verp.DEFAULT_KEY_ENV, raw.get("key_file"),
                              raw.get("previous_key_env"))
    except OSError as exc:
        problems.append(f"bounces.key_file: {exc}")
    if not keys:
        problems.append(f"bounces.key_env: environment variable {raw.get('key_env') or verp.DEFAULT_KEY_ENV} is "
                        "not set: the key the workers sign return paths and unsubscribe links with")
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigurationError(f"{len(problems)} problem(s) in {source}:\n{lines}")
    tls = raw.get("tls", "implicit")
    soft = raw.get("soft_bounce_limit") or None
    secret_env = raw.get("password_env")
    return ReaderConfig(
        host=raw["host"], user=raw["user"], account=raw["account"],
        port=int(raw.get("port") or (993 if tls == "implicit" else 143)), tls=tls,
        allow_plaintext=bool(raw.get("allow_plaintext")), password=env.get(secret_env) if secret_env else None,
        auth=raw.get("auth", "password"), token_env=raw.get("token_env"), ca_file=raw.get("ca_file"),
        verify_tls=bool(raw.get("verify_tls", True)), folder=raw.get("folder", "INBOX"),
        processed_folder=raw.get("processed_folder", "mailq-processed"),
        other_folder=raw.get("other_folder", "mailq-other"), max_messages=int(raw.get("max_messages", 500)),
        timeout_seconds=float(raw.get("timeout_seconds", 30.0)),
        hard_bounce_limit=int(raw.get("hard_bounce_limit") or 1), soft_bounce_limit=soft, keys=tuple(keys),
    )


def load_reader_config(path: str, *, env: Mapping[str, str]) -> ReaderConfig:
    try:
        with open(path, encoding="utf-8") as fh:
            return parse_reader_config(fh.read(), env=env, source=path)
    except OSError as exc:
        raise ConfigurationError(f"cannot read config {path}: {exc.strerror}") from exc


# ------------------------------------------------------------------ IMAP


def _quote(mailbox: str) -> str:
    return '"' + mailbox.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Mailbox:
    """One IMAP session on the bounce folder (imaplib, TLS checked)."""

    def __init__(self, config: ReaderConfig, token_provider: TokenProvider | None = None):
        self.config = config
        self.token_provider = token_provider
        self.imap: imaplib.IMAP4 | None = None
        self.capabilities: set[str] = set()

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.config.ca_file)
        if not self.config.verify_tls:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def open(self) -> Mailbox:
        c = self.config
        if c.tls == "implicit":
            imap: imaplib.IMAP4 = imaplib.IMAP4_SSL(c.host, c.port, ssl_context=self._context(),
                                                    timeout=c.timeout_seconds)
        else:
            imap = imaplib.IMAP4(c.host, c.port, timeout=c.timeout_seconds)
            if c.tls == "starttls":
                imap.starttls(ssl_context=self._context())
        self.imap = imap
        self._login()
        self.capabilities = {cap.upper() for cap in (imap.capabilities or ())}
        for folder in (c.processed_folder, c.other_folder):
            self._ensure(folder)
        typ, data = imap.select(_quote(c.folder))
        if typ != "OK":
            raise ConfigurationError(f"cannot open IMAP folder {c.folder!r}: {data!r}")
        return self

    def _login(self) -> None:
        assert self.imap is not None
        c = self.config
        if c.auth == "xoauth2":
            token = self.token_provider() if self.token_provider else None
            if not token:
                raise ConfigurationError("auth = xoauth2 needs a token provider (token_env)")
            blob = f"user={c.user}\x01auth=Bearer {token}\x01\x01".encode()
            self.imap.authenticate("XOAUTH2", lambda _: blob)
        else:
            self.imap.login(c.user, c.password or "")

    def _ensure(self, folder: str) -> None:
        assert self.imap is not None
        typ, _ = self.imap.select(_quote(folder), readonly=True)
        if typ != "OK":
            typ, data = self.imap.create(_quote(folder))
            if typ != "OK":
                raise ConfigurationError(f"cannot create IMAP folder {folder!r}: {data!r}")

    def uids(self) -> list[bytes]:
        assert self.imap is not None
        typ, data = self.imap.uid("SEARCH", "ALL")
        if typ != "OK":
            raise OSError(f"IMAP UID SEARCH failed: {data!r}")
        return (data[0] or b"").split()[: self.config.max_messages]

    def fetch(self, uid: bytes) -> bytes | None:
        assert self.imap is not None
        typ, data = self.imap.uid("FETCH", uid.decode(), "(BODY.PEEK[])")
        if typ != "OK":
            return None
        for item in data:
            if isinstance(item, tuple) and len(item) == 2:
                return bytes(item[1])
        return None

    def move(self, uid: bytes, folder: str) -> None:
        """MOVE (RFC 6851), else COPY + STORE \\Deleted + UID EXPUNGE (RFC 4315) or EXPUNGE."""
        assert self.imap is not None
        if "MOVE" in self.capabilities:
            typ, data = self.imap.uid("MOVE", uid.decode(), _quote(folder))
            if typ != "OK":
                raise OSError(f"IMAP MOVE to {folder!r} failed: {data!r}")
            return
        typ, data = self.imap.uid("COPY", uid.decode(), _quote(folder))
        if typ != "OK":
            raise OSError(f"IMAP COPY to {folder!r} failed: {data!r}")  # the message stays where it was
        self.imap.uid("STORE", uid.decode(), "+FLAGS.SILENT", r"(\Deleted)")
        if "UIDPLUS" in self.capabilities:
            self.imap.uid("EXPUNGE", uid.decode())
        else:
            self.imap.expunge()

    def close(self) -> None:
        if self.imap is None:
            return
        try:
            self.imap.close()
        except (imaplib.IMAP4.error, OSError):
            pass
        try:
            self.imap.logout()
        except (imaplib.IMAP4.error, OSError):
            pass
        self.imap = None


# ------------------------------------------------------------------ recording


@dataclass
class Outcome:
    action: str  # recorded | unsubscribed | nothing | failed
    report: Report | None = None
    detail: str = ""
    suppressed: list[str] = field(default_factory=list)


def report_key(raw: bytes, report: Report) -> bytes:
    """SHA-256 of the report's Message-ID, else of its bytes: the idempotency key."""
    basis = report.message_id.encode("utf-8") if report.message_id else raw
    return hashlib.sha256(basis).digest()


def _smtp_code(text: str | None) -> int | None:
    m = BASIC_CODE.search(text or "")
    return int(m.group(1)) if m else None


def _recordable(address: str | None) -> bool:
    """One address as mailq.RecordBounce takes it: 1-320 characters, one '@' between non-empty parts."""
    local, at, domain = (address or "").strip().rpartition("@")
    return bool(at and local and domain and "@" not in local and len(address or "") <= 320)


def bounce_recipients(report: Report, token: verp.Token | None) -> list[dict[str, Any]]:
    """The JSON objects mailq.RecordBounce takes: one per recipient that did not
    get the mail (delivered ones are left out); a report that names nobody but
    whose token names the recipient gives one object without an address."""
    out = []
    for r in report.recipients:
        kind = KIND_TO_DB.get(r.kind) or KIND_TO_DB.get(report.kind) if r.kind != "delivered" else None
        if kind is None or (r.guessed and token is not None and token.recipient_no == 0):
            continue  # a guess from the returned headers of a mail with several recipients: maybe the wrong one
        if not _recordable(r.address):
            continue  # mailq.RecordBounce would refuse the whole report (50602) on every pass
        out.append({"address": r.address, "kind": kind, "action": r.action, "status": r.status,
                    "code": _smtp_code(r.diagnostic), "detail": (r.diagnostic or "")[:1000] or None})
    if not out and token is not None and token.recipient_no > 0 and report.kind in KIND_TO_DB:
        out.append({"kind": KIND_TO_DB[report.kind]})
    return out


def process(raw: bytes, config: ReaderConfig, db: Any, procs: Any) -> Outcome:
    """Classify one message and record it; raises on a database error (the message stays)."""
    try:
        report = parse(raw)
    except Exception as exc:  # anyone can mail this mailbox: a message the parser trips on stops only itself
        raise ValueError(f"the message cannot be parsed ({type(exc).__name__}: {exc})") from exc
    signer = verp.Signer(config.keys)
    token = signer.find(report.delivered_to, (verp.UNSUBSCRIBE,)) or signer.find(
        [*report.delivered_to, *report.returned_tokens], (verp.BOUNCE,))
    if token is not None and token.purpose == verp.UNSUBSCRIBE:
        if token.recipient_no < 1:
            return Outcome("nothing", report, "unsubscribe token without a recipient")
        row = db.call(procs.record_unsubscribe, mail_id=token.mail_id, recipient_no=token.recipient_no,
                      source=f"unsubscribe-mailto:{config.source}"[:200])
        return Outcome("unsubscribed", report, f"{row.get('Address')} from mail {token.mail_id}")
    if report.kind not in KIND_TO_DB:
        return Outcome("nothing", report, report.kind)
    recipients = bounce_recipients(report, token)
    if not recipients:
        return Outcome("nothing", report, f"{report.kind} report naming no recipient and no mail")
    rows = db.call(procs.record_bounce, report_key=report_key(raw, report), recipients=recipients,
                   source=config.source, account_name=config.account,
                   mail_id=token.mail_id if token else None, recipient_no=token.recipient_no if token else None,
                   hard_bounce_limit=config.hard_bounce_limit, soft_bounce_limit=config.soft_bounce_limit)
    return Outcome("recorded", report, f"{len(rows)} recipient(s)", [r.address for r in rows if r.suppressed])


@dataclass
class PassSummary:
    seen: int = 0
    recorded: int = 0
    unsubscribed: int = 0
    nothing: int = 0
    failed: int = 0
    suppressed: list[str] = field(default_factory=list)


def run_once(config: ReaderConfig, db: Any, procs: Any, *, mailbox: Mailbox | None = None,
             token_provider: TokenProvider | None = None) -> PassSummary:
    """One pass over the folder; see the module's docstring.  ``db`` is a
    :class:`~mailq_db.connection.ReconnectingConnection`: it retries a deadlock
    or a dropped connection itself (both procedures are idempotent per report)."""
    box = mailbox or Mailbox(config, token_provider)
    summary = PassSummary()
    if box.imap is None:
        box.open()
    try:
        for uid in box.uids():
            raw = box.fetch(uid)
            if raw is None:
                continue
            summary.seen += 1
            try:
                outcome = process(raw, config, db, procs)
            except (DatabaseError, OSError, ValueError) as exc:
                summary.failed += 1
                log.error("bounce not recorded; the message stays in %s and is read again next pass: %s",
                          config.folder, exc)
                continue
            setattr(summary, outcome.action, getattr(summary, outcome.action) + 1)
            summary.suppressed += outcome.suppressed
            folder = config.other_folder if outcome.action == "nothing" else config.processed_folder
            box.move(uid, folder)
            log.info("bounce mailbox: %s (%s) -> %s", outcome.action, outcome.detail, folder)
    finally:
        if mailbox is None:
            box.close()
    return summary
