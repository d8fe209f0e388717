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
* A failed fetch is not repeated by the threads that were waiting for it:
  they get the same error (a copy), so an unreachable identity platform
  costs one timeout per account, not one per waiting thread.  A caller that
  comes after the failure tries again.
* When the identity platform cannot be reached (:class:`TokenUnavailable`)
  while the cached token still has more than :data:`STALE_FLOOR_SECONDS`
  left, that token is used (the margin exists for this), with one WARNING
  line, and the next fetch is tried :data:`STALE_RETRY_SECONDS` later.  A
  refusal (:class:`TokenError`) is never hidden this way.
* A token that is not a bearer token (:data:`BEARER_TOKEN`) is refused, not
  cached: it could break the SASL message it goes into.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..logs import event
from .errors import TokenError, TokenUnavailable

log = logging.getLogger("mailq_db.worker.oauth")

#: a cached token with more than this left is still used while the identity platform cannot be reached
STALE_FLOOR_SECONDS = 30.0
#: ... and the platform is asked again no sooner than this after it could not be reached
STALE_RETRY_SECONDS = 30.0
#: a bearer token (RFC 6750 2.1 b64token, widened to visible ASCII): nothing that could end a
#: SASL field (XOAUTH2 and OAUTHBEARER separate fields with %x01) or the AUTH line
BEARER_TOKEN = re.compile(r"[\x21-\x7e]+")


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


@dataclass(frozen=True)
class _Failure:
    attempt: int  # the number of the fetch that failed (per account)
    error: BaseException
    at: float  # the cache's clock


def _again(exc: BaseException) -> BaseException:
    """A copy of ``exc`` to raise in another thread (the same object if it cannot be copied)."""
    try:
        twin = copy.copy(exc)
    except Exception:  # noqa: BLE001 - an exception whose constructor takes other arguments
        return exc
    return twin if type(twin) is type(exc) and str(twin) == str(exc) else exc


class TokenCache:
    """Tokens per account (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._tokens: dict[str, Token] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._providers: dict[str, Provider] = {}
        self._guard = threading.Lock()
        self._attempts: dict[str, int] = {}  # fetches finished (successful or not), per account
        self._failures: dict[str, _Failure] = {}  # the last fetch's failure, until one succeeds
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

    def _fresh(self, token: Token, margin: float) -> bool:
        # a token that lives less than twice the margin is used for half its life
        lifetime = token.expires_at - token.issued_at
        return token.expires_at - self.clock() > min(margin, lifetime / 2)

    def _usable_despite(self, token: Token | None, failure: _Failure) -> Token | None:
        """The cached token when ``failure`` is the platform being unreachable and it has time left."""
        if token is None or not isinstance(failure.error, TokenUnavailable):
            return None
        left = token.expires_at - self.clock()
        return token if left > STALE_FLOOR_SECONDS else None

    def get(self, key: str, provider: Provider, margin: float) -> Token:
        """A token with more than ``margin`` seconds left; fetched when needed (see the module docstring)."""
        seen = self._attempts.get(key, 0)
        with self._lock(key):
            token = self._tokens.get(key)
            if token is not None and self._fresh(token, margin):
                return token
            failure = self._failures.get(key)
            if failure is not None:
                kept = self._usable_despite(token, failure)
                if kept is not None and self.clock() - failure.at < STALE_RETRY_SECONDS:
                    return kept
                if failure.attempt > seen:  # it failed while this caller waited for it
                    if kept is not None:
                        return kept
                    raise _again(failure.error)
            return self._fetch(key, provider, token)

    def _fetch(self, key: str, provider: Provider, token: Token | None) -> Token:
        """Fetch with the account's lock held; record a failure for the callers waiting behind it."""
        attempt = self._attempts.get(key, 0) + 1
        try:
            new = provider.fetch()
        except Exception as exc:
            self._attempts[key] = attempt
            failure = self._failures[key] = _Failure(attempt, exc, self.clock())
            kept = self._usable_despite(token, failure)
            if kept is None:
                raise
            event(log, logging.WARNING, f"the token of account {key} could not be refreshed; the current one "
                  f"is used while it lasts ({kept.expires_at - self.clock():.0f} s)", account=key, error=str(exc))
            return kept
        self._attempts[key] = attempt
        if not BEARER_TOKEN.fullmatch(new.access_token):
            error = TokenError(f"the access token obtained for account {key} has characters a bearer token "
                               "cannot have (RFC 6750 2.1: visible ASCII, no space)",
                               "check what the token provider returns")
            self._failures[key] = _Failure(attempt, error, self.clock())
            raise error
        self._failures.pop(key, None)
        self._tokens[key] = new
        self.fetches[key] = self.fetches.get(key, 0) + 1
        return new

    def invalidate(self, key: str, token: Token) -> bool:
        """Forget ``token`` (refused by the server) if it is still the cached one."""
        with self._lock(key):
            if self._tokens.get(key) is token:
                del self._tokens[key]
                return True
            return False

    def clear(self) -> None:
        """Forget every token, failure and provider (tests; a configuration reload)."""
        with self._guard:
            self._tokens.clear()
            self._providers.clear()
            self._attempts.clear()
            self._failures.clear()
            self.fetches.clear()


#: The process's cache, used by every SMTP session of the worker.
TOKENS = TokenCache()
