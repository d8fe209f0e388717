"""DKIM signing (RFC 6376) of an account's mail with dkimpy, after the message is built.

``[accounts.NAME.dkim]`` names the signing domain (``d=``), the selector
(``s=``) and the RSA private key (``private_key_file``, or
``private_key_env`` holding the PEM text); docs/dkim.md has the DNS record
and the checks.

* Canonicalization relaxed/relaxed (RFC 6376 3.4.2 and 3.4.4: survives the
  header refolding and trailing-whitespace changes of relays).
* Signed header fields: :data:`SIGNED_HEADERS` (or ``headers``), only those
  present in the message (RFC 6376 5.4: a listed but absent field would
  sign its absence, so a relay adding it, e.g. a Cc, breaks the signature).
  ``From`` is always signed (RFC 6376 5.4).  ``List-Unsubscribe`` and
  ``List-Unsubscribe-Post`` are signed when present, as RFC 8058 4 requires
  for one-click unsubscription.
* The key is read and checked when the configuration is loaded (an RSA key
  of at least 1024 bits, RFC 8301 3.2), and kept in memory; signing does
  not touch the disk.  CRLF line ends (and, in the environment, ``\\n``
  escapes on one line) are accepted.  ``check-config`` warns when the key's
  file is open to other users (:func:`key_file_warning`).  The key never
  appears in a repr, a log line or a message.  A key that cannot be used at
  send time is a :class:`SetupError` (the account waits; no mail is failed
  for it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .classify import SetupError

#: The default signed header fields (each signed only when present in the message).
SIGNED_HEADERS = ("From", "To", "Cc", "Reply-To", "Subject", "Date", "Message-ID", "MIME-Version",
                  "Content-Type", "In-Reply-To", "References", "List-Unsubscribe", "List-Unsubscribe-Post")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = re.compile(rf"^{_LABEL}(?:\.{_LABEL})+$")
_SELECTOR = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_FIELD = re.compile(rb"^([\x21-\x39\x3b-\x7e]+)[ \t]*:", re.MULTILINE)
EXTRA_LINE = "DKIM signing needs dkimpy: pip install 'mailq-db[dkim]'"


class DkimError(SetupError):
    """The account's DKIM key cannot sign (the account waits; fix the key)."""


@dataclass(frozen=True)
class DkimSettings:
    domain: str
    selector: str
    key_source: str  # "$VAR" or the file name, for messages
    private_key: bytes = field(repr=False, compare=False)
    headers: tuple[str, ...] = SIGNED_HEADERS
    key_bits: int = 0


class _Counting:
    def __init__(self, problems: Any):
        self.problems, self.count = problems, 0

    def add(self, where: str, text: str) -> None:
        self.count += 1
        self.problems.add(where, text)


def _dkimpy() -> Any:
    try:
        import dkim
    except ImportError:
        raise DkimError(EXTRA_LINE) from None
    return dkim


def key_bits(pem: bytes) -> int:
    """The modulus size of an RSA private key in PEM (PKCS#1 or PKCS#8), via dkimpy's parser."""
    from dkim.crypto import parse_pem_private_key

    return int(parse_pem_private_key(pem)["modulus"]).bit_length()


def parse_dkim(where: str, raw: Any, env: Mapping[str, str], problems: Any) -> DkimSettings | None:
    """``[accounts.NAME.dkim]``; adds each problem (with what to do) and returns None on any."""
    if not isinstance(raw, dict):
        problems.add(where, f"must be a table [{where}] with domain, selector and private_key_file")
        return None
    raw = dict(raw)
    problems = _Counting(problems)
    values = {k: raw.pop(k) for k in ("domain", "selector", "private_key_file", "private_key_env", "headers")
              if k in raw}
    for key in raw:
        problems.add(f"{where}.{key}", "unknown setting (dkim takes domain, selector, private_key_file or "
                     "private_key_env, headers)")
    domain, selector = values.get("domain"), values.get("selector")
    if not isinstance(domain, str) or not _DOMAIN.match(domain):
        problems.add(f"{where}.domain", f"must be the signing domain (d=), e.g. example.com (got {domain!r})")
    if not isinstance(selector, str) or not _SELECTOR.match(selector):
        problems.add(f"{where}.selector", f"must be a DNS label such as mailq2026 (got {selector!r})")
    headers = values.get("headers", list(SIGNED_HEADERS))
    if not isinstance(headers, list) or not all(isinstance(h, str) and re.fullmatch(r"[\x21-\x39\x3b-\x7e]+", h)
                                                for h in headers):
        problems.add(f"{where}.headers", "must be a list of header field names")
        headers = list(SIGNED_HEADERS)
    elif "from" not in (h.lower() for h in headers):
        problems.add(f"{where}.headers", "must include From (RFC 6376 5.4)")
    pem, source = _key(where, values, env, problems)
    bits = 0
    if pem is not None:
        try:
            _dkimpy()
            bits = key_bits(pem)
        except DkimError as exc:
            problems.add(where, str(exc))
        except Exception as exc:  # noqa: BLE001 - dkimpy raises several types for a bad key
            problems.add(f"{where}.private_key", f"{source} is not an RSA private key in PEM ({type(exc).__name__}); "
                         "make one with: openssl genrsa -out dkim.key 2048")
        else:
            if bits < 1024:
                problems.add(f"{where}.private_key", f"{source} is a {bits}-bit key: DKIM needs at least 1024 bits "
                             "(RFC 8301 3.2), 2048 recommended")
    if problems.count or pem is None or not isinstance(domain, str) or not isinstance(selector, str):
        return None
    return DkimSettings(domain.lower(), selector, source, pem, tuple(headers), bits)


def _key(where: str, values: dict[str, Any], env: Mapping[str, str], problems: Any) -> tuple[bytes | None, str]:
    path, var = values.get("private_key_file"), values.get("private_key_env")
    if path and var:
        problems.add(where, "set private_key_file or private_key_env, not both")
        return None, ""
    if var:
        if not isinstance(var, str) or var not in env:
            problems.add(f"{where}.private_key_env", f"environment variable {var} is not set")
            return None, ""
        text = env[var].encode("ascii", "replace")
        if b"\n" not in text and b"\\n" in text:  # one line with \n escapes, as env files often hold it
            text = text.replace(b"\\n", b"\n")
        return _lf(text), f"${var}"
    if path:
        try:
            with open(path, "rb") as fh:
                return _lf(fh.read()), str(path)
        except OSError as exc:
            problems.add(f"{where}.private_key_file", f"cannot read {path}: {exc.strerror}")
            return None, ""
    problems.add(where, "the private key is required: set private_key_file (a PEM file readable by the worker) "
                 "or private_key_env")
    return None, ""


def _lf(pem: bytes) -> bytes:
    """PEM with LF line ends: dkimpy finds the key between ``--\\n`` and ``\\n--`` only, so a key
    saved with CRLF (copied from Windows) would not be found."""
    return pem.replace(b"\r\n", b"\n")


def key_file_warning(settings: DkimSettings) -> str | None:
    """A warning when the private key's file may be read or changed by other users, else None."""
    if settings.key_source.startswith("$"):
        return None
    return permission_warning(settings.key_source, "the DKIM private key")


def permission_warning(path: str, what: str) -> str | None:
    """A warning when the secret file ``path`` is open to every user of the machine (read, write)
    or writable by its group; None when it is not, or cannot be examined."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        return None
    if mode & 0o007 or mode & 0o020:
        who = "every user of this machine" if mode & 0o007 else "its group"
        return (f"{path} ({what}) can be read or changed by {who} (mode {mode:04o}): "
                f"chmod 600 {path} (or 640 with a group of the worker's user only)")
    return None


def present_fields(data: bytes) -> set[str]:
    """The lower-cased names of the header fields of a message."""
    head = data.split(b"\r\n\r\n", 1)[0]
    return {m.group(1).decode("ascii").lower() for m in _FIELD.finditer(head)}


def sign(settings: DkimSettings, data: bytes) -> bytes:
    """``data`` with a DKIM-Signature header field prepended."""
    dkim = _dkimpy()
    present = present_fields(data)
    include = [h.encode("ascii") for h in settings.headers if h.lower() in present]
    try:
        signature = dkim.sign(data, settings.selector.encode("ascii"), settings.domain.encode("ascii"),
                              settings.private_key, canonicalize=(b"relaxed", b"relaxed"),
                              include_headers=include, linesep=b"\r\n")
    except dkim.DKIMException as exc:
        raise DkimError(f"DKIM signing for {settings.domain} failed: {exc} (key {settings.key_source})") from None
    return signature + data


def sign_outgoing(account: Any, out: Any) -> Any:
    """The Outgoing of ``account`` signed when the account has ``dkim``, else as it is."""
    settings = getattr(account, "dkim", None)
    if settings is None:
        return out
    return replace(out, data=sign(settings, out.data))

