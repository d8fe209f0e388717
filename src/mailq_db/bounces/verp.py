"""Signed tokens for VERP return paths and unsubscribe links.

A token names one mail and one of its recipients, and proves that mailq-db
made it::

    payload = varint(mail ID) || varint(recipient number)
    mac     = HMAC-SHA256(key, "mailq-db/" || purpose || 0x00 || payload)[:10]
    token   = base32(payload || mac), lower case, no padding

* purpose ``b``: the envelope sender ``bounces+<token>@domain`` (VERP): a
  report sent back to it maps to the mail and recipient even when it omits
  the original headers.  Purpose ``u``: one-click unsubscribe links and the
  ``mailto:`` of ``List-Unsubscribe``.  A token of one purpose never verifies
  as the other.
* Recipient number: 1-based position in the mail's recipient list as the
  worker sends it (To, then Cc, then Bcc, each address once); 0 when the mail
  has several recipients (one SMTP transaction carries one envelope sender,
  so the report itself must say who failed).
* Length: a mail ID below 2^35 (34 billion) and recipient number below 128
  take 6 payload bytes, so the token is 16 bytes = 26 base32 characters and
  ``bounces+<token>`` is a 34-character local part (RFC 5321 allows 64).
  Base32 because local parts are often lower-cased on the way back.
* Forgery: without the key, a made-up or altered token verifies with
  probability 2^-80 (about 8e-25) per try: the 80-bit truncated HMAC-SHA256
  (truncation to at least 80 bits is NIST SP 800-107's floor for HMAC).
  Tokens are not secret (anyone who received the mail has one); they are
  unforgeable, and they never expire: a report or unsubscribe months later
  still verifies, until the key is rotated out.
* Keys: at least 32 bytes, from the environment (``MAILQ_BOUNCE_KEY`` by
  default) or a file, never from the configuration file itself.  Verification
  tries every configured key, so a key can be rotated by adding the new one
  first and removing the old one after the reports that carry it stopped.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

MAC_BYTES = 10
MIN_KEY_BYTES = 32
DEFAULT_KEY_ENV = "MAILQ_BOUNCE_KEY"
BOUNCE, UNSUBSCRIBE = "b", "u"
TOKEN_RE = re.compile(r"^[a-z2-7]{18,64}$")


class TokenError(ValueError):
    """A token or key that cannot be used."""


@dataclass(frozen=True)
class Token:
    purpose: str
    mail_id: int
    recipient_no: int  # 1-based; 0: the mail as a whole


def _varint(n: int) -> bytes:
    if n < 0:
        raise TokenError(f"{n} is negative")
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            break
    raise TokenError("malformed token payload")


class Signer:
    """Makes and verifies tokens with the first key; verifies with every key."""

    def __init__(self, keys: Iterable[bytes]):
        self.keys = [bytes(k) for k in keys]
        if not self.keys:
            raise TokenError("no key: set MAILQ_BOUNCE_KEY (at least 32 bytes)")
        for k in self.keys:
            if len(k) < MIN_KEY_BYTES:
                raise TokenError(f"a key has {len(k)} bytes; at least {MIN_KEY_BYTES} are required")

    @staticmethod
    def _mac(key: bytes, purpose: str, payload: bytes) -> bytes:
        return hmac.new(key, b"mailq-db/" + purpose.encode() + b"\0" + payload, hashlib.sha256).digest()[:MAC_BYTES]

    def token(self, purpose: str, mail_id: int, recipient_no: int) -> str:
        payload = _varint(int(mail_id)) + _varint(int(recipient_no))
        raw = payload + self._mac(self.keys[0], purpose, payload)
        return base64.b32encode(raw).decode("ascii").rstrip("=").lower()

    def verify(self, purpose: str, token: str) -> Token | None:
        """The token's mail and recipient, or None when it is not a valid token of ``purpose``."""
        token = token.strip().lower()
        if not TOKEN_RE.match(token):
            return None
        try:
            raw = base64.b32decode(token.upper() + "=" * (-len(token) % 8))
        except ValueError:
            return None
        if len(raw) <= MAC_BYTES or base64.b32encode(raw).decode("ascii").rstrip("=").lower() != token:
            return None  # too short, or unused bits set: one token has one spelling
        payload, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
        if not any(hmac.compare_digest(mac, self._mac(k, purpose, payload)) for k in self.keys):
            return None
        try:
            mail_id, pos = _read_varint(payload, 0)
            recipient_no, pos = _read_varint(payload, pos)
        except TokenError:
            return None
        return Token(purpose, mail_id, recipient_no) if pos == len(payload) else None

    def find(self, addresses: Iterable[str], purposes: Iterable[str] = (BOUNCE, UNSUBSCRIBE)) -> Token | None:
        """The first valid token in the ``+detail`` of any of ``addresses`` (VERP);
        an item without '@' is tried as a bare token (an X-Mailq-Token value)."""
        wanted = tuple(purposes)
        for addr in addresses:
            local, at, _ = addr.rpartition("@")
            details = local.split("+")[1:] if at else [addr]
            for detail in details:
                for purpose in wanted:
                    found = self.verify(purpose, detail)
                    if found is not None:
                        return found
        return None


def recipient_no(recipients: Iterable[str]) -> int:
    """The number a token carries for a mail sent to ``recipients`` (see the module's docstring)."""
    return 1 if len(list(recipients)) == 1 else 0


def fill(template: str, token: str) -> str:
    return template.replace("{token}", token)


def load_keys(env: Mapping[str, str], key_env: str = DEFAULT_KEY_ENV, key_file: str | None = None,
              previous_key_env: str | None = None) -> list[bytes]:
    """The keys, newest first: the file (or the variable), then the previous key's variable."""
    keys: list[bytes] = []
    if key_file:
        with open(key_file, "rb") as fh:
            keys.append(fh.read().strip())
    elif env.get(key_env):
        keys.append(env[key_env].encode("utf-8"))
    if previous_key_env and env.get(previous_key_env):
        keys.append(env[previous_key_env].encode("utf-8"))
    return keys


@dataclass(frozen=True)
class BounceSettings:
    """``[accounts.NAME.bounces]`` of the worker's configuration."""

    return_path: str | None = None  # e.g. "bounces+{token}@bounce.example.com"
    unsubscribe_url: str | None = None  # e.g. "https://mail.example.com/unsubscribe/{token}"
    unsubscribe_mailto: str | None = None  # e.g. "bounces+{token}@bounce.example.com"
    key_env: str = DEFAULT_KEY_ENV
    key_file: str | None = None
    previous_key_env: str | None = None
    keys: tuple[bytes, ...] = field(default=(), repr=False)

    def signer(self) -> Signer:
        return Signer(self.keys)


SETTINGS_KEYS = ("return_path", "unsubscribe_url", "unsubscribe_mailto", "key_env", "key_file", "previous_key_env")
_ADDRESS_TEMPLATE = re.compile(r"^[A-Za-z0-9._-]+\+\{token\}@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$")


def _str(raw: dict[str, object], key: str, where: str, problem: Callable[[str, str], None]) -> str | None:
    value = raw.pop(key, None)
    if value is not None and not isinstance(value, str):
        problem(f"{where}.{key}", f"must be a string, got {value!r}")
        return None
    return value


def parse_settings(raw: object, where: str, env: Mapping[str, str],
                   problem: Callable[[str, str], None]) -> BounceSettings | None:
    """Validate ``[accounts.NAME.bounces]``; every problem goes to ``problem(where, text)``."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problem(where, "must be a table: [accounts.NAME.bounces] with return_path, unsubscribe_url, ...")
        return None
    raw = dict(raw)
    values = {k: _str(raw, k, where, problem) for k in SETTINGS_KEYS}
    for key in raw:
        problem(f"{where}.{key}", f"unknown setting (expected one of {', '.join(SETTINGS_KEYS)})")
    for key in ("return_path", "unsubscribe_mailto"):
        if values[key] and not _ADDRESS_TEMPLATE.match(values[key] or ""):
            problem(f"{where}.{key}", f"{values[key]!r} must look like local+{{token}}@domain, e.g. "
                    "bounces+{token}@bounce.example.com (the token is the +detail of the local part)")
    url = values["unsubscribe_url"]
    if url and (not url.startswith("https://") or "{token}" not in url):
        problem(f"{where}.unsubscribe_url", "must be an https:// URL containing {token} (RFC 8058 section 3.1)")
    if url and not values["unsubscribe_mailto"]:
        problem(f"{where}.unsubscribe_mailto", "is required with unsubscribe_url: List-Unsubscribe carries both "
                "an https and a mailto URI, so every receiver has one it can use")
    key_env = values["key_env"] or DEFAULT_KEY_ENV
    if values["key_file"] and not os.path.isfile(values["key_file"] or ""):
        problem(f"{where}.key_file", f"{values['key_file']} does not exist")
        return None
    keys = load_keys(env, key_env, values["key_file"], values["previous_key_env"])
    if not keys:
        problem(f"{where}.key_env", f"environment variable {key_env} is not set: it holds the secret that signs "
                "return paths and unsubscribe links (at least 32 bytes; the same for workers, the bounce reader "
                "and the unsubscribe server)")
    elif any(len(k) < MIN_KEY_BYTES for k in keys):
        problem(f"{where}.key_env", f"the key must be at least {MIN_KEY_BYTES} bytes long")
    return BounceSettings(values["return_path"], url, values["unsubscribe_mailto"], key_env,
                          values["key_file"], values["previous_key_env"], tuple(keys))
