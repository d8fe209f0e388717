"""Access tokens cached per account and process, refreshed before they expire.

* One :class:`TokenCache` per process (:data:`TOKENS`), shared by every worker
  thread; entries are keyed by the account's name.
* :meth:`TokenCache.get` returns the cached token while it has more than the
  account's margin left (at most half of the token's lifetime), else fetches
  a new one.  Fetching holds the
  account's lock, so one refresh at a time per account: the other threads of
  that account wait for it and then use its token (accounts never wait for
  each other).
* :meth:`TokenCache.invalidate` drops a token the server refused, but only
  if it is still the cached one: a thread that comes late with an old token
  does not throw away the fresh token another thread just fetched.
* Expiry is measured on the monotonic clock (``expires_in`` from the
  identity platform), so a wall-clock jump neither keeps an expired token nor
  throws away a good one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol


@dataclass(frozen=True)
class Token:
    """An access token and when it expires (``time.monotonic()`` seconds).

    The token itself is never part of ``repr``; only its last four characters
    are kept for logs (``hint``), which identify it without being usable.
    """

    access_token: str = field(repr=False)
    expires_at: float
    issued_at: float = 0.0

    @property
    def hint(self) -> str:
        return "…" + self.access_token[-4:] if len(self.access_token) > 16 else "…"


class Provider(Protocol):
    """Obtains a new access token (raises TokenError / TokenUnavailable / MissingExtra)."""

    def fetch(self) -> Token: ...


class TokenCache:
    """Tokens per account (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._tokens: dict[str, Token] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._providers: dict[str, Provider] = {}
        self._guard = threading.Lock()
        #: how many tokens were fetched, per account (tests and metrics)
        self.fetches: dict[str, int] = {}

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def provider(self, key: str, make: Callable[[], Provider]) -> Provider:
        """The account's provider, made once per process (MSAL and google-auth
        objects keep their HTTP sessions and metadata)."""
        with self._guard:
            found = self._providers.get(key)
            if found is None:
                found = self._providers[key] = make()
            return found

    def get(self, key: str, provider: Provider, margin: float) -> Token:
        """A token with more than ``margin`` seconds left; fetched when needed."""
        with self._lock(key):
            token = self._tokens.get(key)
            if token is not None:
                # a token that lives less than twice the margin is used for half its life
                lifetime = token.expires_at - token.issued_at
                if token.expires_at - self.clock() > min(margin, lifetime / 2):
                    return token
            token = provider.fetch()
            self._tokens[key] = token
            self.fetches[key] = self.fetches.get(key, 0) + 1
            return token

    def invalidate(self, key: str, token: Token) -> bool:
        """Forget ``token`` (refused by the server) if it is still the cached one."""
        with self._lock(key):
            if self._tokens.get(key) is token:
                del self._tokens[key]
                return True
            return False

    def clear(self) -> None:
        """Forget every token and provider (tests; a configuration reload)."""
        with self._guard:
            self._tokens.clear()
            self._providers.clear()
            self.fetches.clear()


#: The process's cache, used by every SMTP session of the worker.
TOKENS = TokenCache()
