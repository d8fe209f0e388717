"""A program that prints an access token, like msmtp's ``passwordeval``.

The command is an argv list run without a shell (no quoting, no injection),
with stdin closed, the worker's environment, in a process group of its own.
Its standard output is either the bare token (first non-empty line; the
token is then taken to live ``token_lifetime_seconds``) or a JSON object with
``access_token`` and, optionally, ``expires_in`` (an OAuth 2.0 token
response, RFC 6749 5.1).

* ``timeout_seconds`` bounds the whole run: then the program and whatever it
  started in its group are killed (SIGKILL), a :class:`TokenUnavailable`.
  Once the program has exited, a child it left behind holding the output
  open is not waited for.
* At most :data:`MAX_OUTPUT_BYTES` of standard output are read (more is a
  :class:`TokenError`, the program killed); of standard error only the last
  :data:`STDERR_TAIL_BYTES` are kept.
* A non-zero exit status, a timeout or output without a token is a
  :class:`TokenError` whose message has the exit status and the last line of
  standard error, never the standard output; long token-like runs of
  characters in that line are replaced by ``[redacted]``.
* The token must be a bearer token (RFC 6750 b64token: visible ASCII, no
  space), so it cannot break the SASL message it is put into.
"""

from __future__ import annotations

import json
import math
import os
import re
import selectors
import signal
import subprocess
import time
from typing import Any

from .cache import Token
from .errors import TokenError, TokenUnavailable
from .settings import OAuthSettings

#: the most a token command may print on standard output (an Entra ID JWT is 1.5-2.5 KB)
MAX_OUTPUT_BYTES = 64 * 1024
#: how much of the end of standard error is kept for the error message
STDERR_TAIL_BYTES = 4096
#: a run of token characters this long (with a digit in it) is not repeated from standard error
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9_.~+/-]{24,}=*")
#: RFC 6750 2.1 b64token, widened to every visible ASCII character but none of SASL's separators
_VISIBLE = re.compile(r"[\x21-\x7e]+")


class _TooMuchOutput(Exception):
    pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _read(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes]:
    """Standard output and the tail of standard error, until both end or the program has exited."""
    out, err = bytearray(), bytearray()
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        exited = False
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            events = sel.select(0 if exited else min(left, 0.1))
            if not events and exited:
                break  # the program is gone; a child it left keeps the pipe open: not waited for
            exited = exited or proc.poll() is not None
            for key, _ in events:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if key.data is out and len(out) > MAX_OUTPUT_BYTES:
                    raise _TooMuchOutput()
                if key.data is err:
                    del err[:-STDERR_TAIL_BYTES]
    return bytes(out), bytes(err)


def run_bounded(argv: list[str], timeout: float) -> tuple[int, bytes, bytes]:
    """Run ``argv`` (see the module docstring): (exit status, standard output, end of standard error).
    Raises ``subprocess.TimeoutExpired`` or ``_TooMuchOutput`` with the program's group killed."""
    if os.name != "posix":  # pragma: no cover - no process groups or selectable pipes: the plain bounds
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
        if len(done.stdout) > MAX_OUTPUT_BYTES:
            raise _TooMuchOutput()
        return done.returncode, done.stdout, done.stderr[-STDERR_TAIL_BYTES:]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            shell=False, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        out, err = _read(proc, deadline)
        status = proc.wait(max(deadline - time.monotonic(), 0.0))
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    return status, out, err


def redact(line: str, printed: bytes = b"") -> str:
    """``line`` without what the program printed on standard output and without token-like runs."""
    for part in printed.decode("utf-8", "replace").split():
        if len(part) >= 8:
            line = line.replace(part, "[redacted]")
    return _TOKEN_LIKE.sub(lambda m: "[redacted]" if re.search(r"\d", m.group(0)) else m.group(0), line)


class Command:
    def __init__(self, settings: OAuthSettings, *, clock: Any = time.monotonic):
        self.settings = settings
        self.clock = clock

    def fetch(self) -> Token:
        s = self.settings
        argv = list(s.command)
        try:
            status, out, err = run_bounded(argv, s.timeout_seconds)
        except subprocess.TimeoutExpired:
            raise TokenUnavailable(f"the token command {argv[0]} did not finish within {s.timeout_seconds:g} s "
                                   "(timeout_seconds)") from None
        except _TooMuchOutput:
            raise TokenError(f"the token command {argv[0]} printed more than {MAX_OUTPUT_BYTES // 1024} KiB",
                             "the command must print only the token, or a token response in JSON") from None
        except OSError as exc:
            raise TokenError(f"the token command {argv[0]} could not be started ({exc.strerror})",
                             "check command: the program must exist and be executable by the worker's user") \
                from None
        if status != 0:
            lines = err.decode("utf-8", "replace").strip().splitlines()
            detail = f": {redact(lines[-1], out)[:300]}" if lines else ""
            raise TokenError(f"the token command {argv[0]} exited with status {status}{detail}",
                             "run the command by hand as the worker's user and fix what it reports")
        return self._parse(out.decode("utf-8", "replace"), argv[0])

    def _parse(self, out: str, program: str) -> Token:
        text = out.strip()
        now = self.clock()
        lifetime = self.settings.token_lifetime_seconds
        if text.startswith("{"):
            token, lifetime = self._json(text, program, lifetime)
        else:
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            token = lines[0] if lines else ""
        if not isinstance(token, str) or not token:
            raise TokenError(f"the token command {program} printed no token",
                             "the command must print the access token on its first line")
        if not _VISIBLE.fullmatch(token):
            raise TokenError(f"the token command {program} printed a token with characters a bearer token "
                             "cannot have (spaces, control or non-ASCII characters)",
                             "the command must print the access token alone on its first line")
        return Token(token, now + lifetime, now)

    @staticmethod
    def _json(text: str, program: str, lifetime: float) -> tuple[Any, float]:
        try:
            data = json.loads(text)
            token = data["access_token"]
            if "expires_in" in data:
                lifetime = float(data["expires_in"])
        except (ValueError, KeyError, TypeError):
            raise TokenError(f"the token command {program} printed JSON without a usable access_token",
                             'print the bare token, or {"access_token": "...", "expires_in": 3599}') from None
        if not (math.isfinite(lifetime) and lifetime > 0):
            raise TokenError(f"the token command {program} printed an expires_in that is not a positive number "
                             "of seconds", "print the seconds the token has left, e.g. \"expires_in\": 3599")
        return token, lifetime
