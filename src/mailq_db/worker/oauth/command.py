"""A program that prints an access token, like msmtp's ``passwordeval``.

The command is an argv list run without a shell (no quoting, no injection),
with stdin closed, a timeout, and the worker's environment.  Its standard
output is either the bare token (first non-empty line; the token is then
taken to live ``token_lifetime_seconds``) or a JSON object with
``access_token`` and, optionally, ``expires_in`` (an OAuth 2.0 token
response, RFC 6749 5.1).  A non-zero exit status, a timeout or empty output is
a :class:`TokenError` whose message has the exit status and the last line of
standard error (which must not print secrets), never the standard output.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from .cache import Token
from .errors import TokenError, TokenUnavailable
from .settings import OAuthSettings


class Command:
    def __init__(self, settings: OAuthSettings, *, clock: Any = time.monotonic):
        self.settings = settings
        self.clock = clock

    def fetch(self) -> Token:
        s = self.settings
        argv = list(s.command)
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=s.timeout_seconds,
                                  check=False, shell=False)
        except subprocess.TimeoutExpired:
            raise TokenUnavailable(f"the token command {argv[0]} did not finish within {s.timeout_seconds:g} s "
                                   "(timeout_seconds)") from None
        except OSError as exc:
            raise TokenError(f"the token command {argv[0]} could not be started ({exc.strerror})",
                             "check command: the program must exist and be executable by the worker's user") \
                from None
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise TokenError(f"the token command {argv[0]} exited with status {proc.returncode}"
                             + (f": {err[-1][:300]}" if err else ""),
                             "run the command by hand as the worker's user and fix what it reports")
        return self._parse(proc.stdout.decode("utf-8", "replace"), argv[0])

    def _parse(self, out: str, program: str) -> Token:
        text = out.strip()
        now = self.clock()
        lifetime = self.settings.token_lifetime_seconds
        if text.startswith("{"):
            try:
                data = json.loads(text)
                token = data["access_token"]
                if "expires_in" in data:
                    lifetime = float(data["expires_in"])
            except (ValueError, KeyError, TypeError):
                raise TokenError(f"the token command {program} printed JSON without a usable access_token",
                                 'print the bare token, or {"access_token": "...", "expires_in": 3599}') from None
        else:
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            token = lines[0] if lines else ""
        if not isinstance(token, str) or not token or any(c.isspace() for c in token) or not token.isascii():
            raise TokenError(f"the token command {program} printed no token",
                             "the command must print the access token on its first line")
        return Token(token, now + lifetime, now)
