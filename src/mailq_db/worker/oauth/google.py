"""Google tokens through google-auth (Google's own library).

* :class:`ServiceAccount`: a service account with domain-wide delegation acts
  for a Workspace mailbox (``subject``); scope ``https://mail.google.com/``
  (https://developers.google.com/workspace/gmail/imap/xoauth2-protocol and
  https://developers.google.com/identity/protocols/oauth2/service-account).
* :class:`RefreshToken`: a refresh token redeemed at an RFC 6749 token
  endpoint with google-auth's refresh grant (section 6): Google's
  (``issuer = "google"``) or any standard endpoint (``issuer = "generic"``,
  ``token_uri``).  A rotated refresh token is written back to its file
  (:mod:`.refresh`).

``request`` may be given (tests pass a fake transport with recorded
responses); by default google-auth's requests transport, with the account's
``timeout_seconds`` per HTTP request.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from datetime import datetime, timezone
from typing import Any

from .cache import Token
from .errors import MissingExtra, TokenError, TokenUnavailable, explain_google
from .refresh import StoredRefreshToken
from .settings import OAuthSettings


def _google() -> tuple[Any, Any, Any]:
    try:
        from google.auth import exceptions
        from google.oauth2 import credentials, service_account
    except ImportError:  # pragma: no cover - exercised by the extras test with a blocked import
        raise MissingExtra("the google token provider needs google-auth: pip install 'mailq-db[oauth-google]'") \
            from None
    return exceptions, credentials, service_account


def _default_request() -> Any:
    try:
        from google.auth.transport.requests import Request
    except ImportError:  # pragma: no cover - requests is part of the oauth-google extra
        raise MissingExtra("google-auth needs requests for HTTP: pip install 'mailq-db[oauth-google]'") from None
    return Request()


#: google-auth's transports, whose DEBUG line "Making request..." carries the request body
_TRANSPORT_LOGGERS = ("google.auth.transport.requests", "google.auth.transport.urllib3")


class _NoAssertionInLogs(logging.Filter):
    """google-auth hashes access and refresh tokens and the client secret in its DEBUG request
    log, but not the JWT bearer grant's ``assertion``: a signed JWT that can be redeemed for a
    token of the mailbox until it expires (one hour).  This filter replaces it."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "httpRequest", None)
        body = request.get("body") if isinstance(request, dict) else None
        if isinstance(body, dict) and "assertion" in body:
            record.httpRequest = {**request, "body": {**body, "assertion": "[redacted]"}}  # type: ignore[dict-item]
        return True


def _guard_logs() -> None:
    for name in _TRANSPORT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoAssertionInLogs) for f in logger.filters):
            logger.addFilter(_NoAssertionInLogs())


class _GoogleAuth:
    def __init__(self, settings: OAuthSettings, *, request: Any = None, clock: Any = time.monotonic):
        _guard_logs()
        self.settings = settings
        self._request = request
        self.clock = clock

    def _transport(self) -> Any:
        if self._request is None:
            self._request = _default_request()
        return functools.partial(self._request, timeout=self.settings.timeout_seconds)

    def _refresh(self, credentials: Any) -> Token:
        exceptions = _google()[0]
        try:
            credentials.refresh(self._transport())
        except exceptions.RefreshError as exc:
            data = exc.args[1] if len(exc.args) > 1 else None
            refusal = explain_google(data, str(exc.args[0]) if exc.args else "")
            if getattr(exc, "retryable", False) and not isinstance(refusal, TokenUnavailable):
                # google-auth's own judgement after its retries: a 5xx, 429 or 408, or an
                # internal_failure / server_error answer (a page that is not JSON included)
                raise TokenUnavailable(str(refusal).split("; fix: ")[0]) from None
            raise refusal from None
        except exceptions.TransportError as exc:
            raise TokenUnavailable(f"the token endpoint could not be reached: {type(exc).__name__}") from None
        expiry = credentials.expiry  # naive UTC (google-auth's convention)
        now = self.clock()
        if expiry is None:
            left = 3600.0
        else:
            left = (expiry.replace(tzinfo=timezone.utc) - datetime.now(timezone.utc)).total_seconds()
        return Token(credentials.token, now + max(left, 0.0), now)


class ServiceAccount(_GoogleAuth):
    """Domain-wide delegation: the service account signs a JWT for ``subject``."""

    def fetch(self) -> Token:
        _, _, service_account = _google()
        s = self.settings
        assert s.service_account is not None
        try:
            info = json.loads(s.service_account.read())
        except (OSError, ValueError) as exc:
            raise TokenError(f"the service account key in {s.service_account.describe()} is not readable JSON "
                             f"({type(exc).__name__})", "download a JSON key of the service account (IAM & Admin "
                             "> Service accounts > Keys) and point service_account_file at it") from None
        if s.token_uri and isinstance(info, dict):
            # google-auth takes the endpoint from the key (a keyword would be passed twice)
            info = {**info, "token_uri": s.token_uri}
        try:
            creds = service_account.Credentials.from_service_account_info(
                info, scopes=list(s.scopes), subject=s.subject)
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenError(f"the service account key in {s.service_account.describe()} is not a service "
                             f"account key ({type(exc).__name__}: missing or bad field)",
                             "use the JSON key file of a service account (type service_account)") from None
        return self._refresh(creds)


class RefreshToken(_GoogleAuth):
    """A refresh token at Google's or another standard (RFC 6749) token endpoint."""

    def __init__(self, settings: OAuthSettings, **kwargs: Any):
        super().__init__(settings, **kwargs)
        assert settings.refresh_token is not None
        self.stored = StoredRefreshToken(settings.refresh_token)

    def fetch(self) -> Token:
        _, credentials, _ = _google()
        s = self.settings
        assert s.client_secret is not None
        refresh = self.stored.current()
        creds = credentials.Credentials(None, refresh_token=refresh, token_uri=s.token_uri, client_id=s.client_id,
                                        client_secret=s.client_secret.read(), scopes=list(s.scopes) or None)
        token = self._refresh(creds)
        self.stored.rotated(refresh, creds.refresh_token)
        return token
