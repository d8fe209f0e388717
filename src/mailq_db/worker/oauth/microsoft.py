"""Microsoft identity platform tokens through MSAL for Python (the platform's own library).

* :class:`ClientCredentials`: an application signs in as itself (client
  credentials grant) for Exchange Online SMTP AUTH; the scope is
  ``https://outlook.office365.com/.default`` and the application needs the
  SMTP.SendAsApp application permission with admin consent, and its service
  principal registered in Exchange Online with a mailbox permission
  (https://learn.microsoft.com/en-us/exchange/client-developer/legacy-protocols/how-to-authenticate-an-imap-pop-smtp-application-by-using-oauth).
* :class:`RefreshToken`: a delegated mailbox, from a refresh token obtained
  once interactively (MSAL's ``acquire_token_by_refresh_token``; scope
  ``https://outlook.office.com/SMTP.Send``).  Entra ID returns a new refresh
  token with each use; it is written back to the token's file
  (:mod:`.refresh`: atomically, mode 0600), or kept in memory when it cannot be.

MSAL keeps its own token cache; a forced refresh (after the server refused a
token) removes the cached access tokens first, so the token endpoint is asked.
``http_client`` may be given (tests pass a fake with recorded responses).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from .cache import Token
from .errors import MissingExtra, TokenError, TokenUnavailable, explain_microsoft
from .refresh import StoredRefreshToken
from .settings import OAuthSettings, Secret, read_secret_file


def _msal() -> Any:
    try:
        import msal
    except ImportError:  # pragma: no cover - exercised by the extras test with a blocked import
        raise MissingExtra("the microsoft token provider needs MSAL: pip install 'mailq-db[oauth-microsoft]'") \
            from None
    return msal


def _token(result: dict[str, Any], clock: Any) -> Token:
    now = clock()
    expires_in = float(result.get("expires_in") or 3600)
    return Token(result["access_token"], now + expires_in, now)


def _certificate_credential(path: str, password: Secret | None) -> dict[str, Any]:
    """MSAL's client_credential for a PEM (key and certificate) or PFX file."""
    passphrase = password.read() if password else None
    if path.lower().endswith((".pfx", ".p12")):
        read_secret_file(path, "latin-1")  # MSAL reads it; a missing file is ours to explain
        cred: dict[str, Any] = {"private_key_pfx_path": path}
    else:
        pem = read_secret_file(path, "ascii")
        key = re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.+?-----END [A-Z ]*PRIVATE KEY-----", pem, re.S)
        cert = re.search(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", pem, re.S)
        if not key or not cert:
            raise TokenError(f"{path} must hold the private key and the certificate (PEM), or be a .pfx file",
                             "concatenate the key and the certificate uploaded to the application into one file")
        # MSAL >= 1.35 derives the SHA-256 thumbprint from the certificate
        cred = {"private_key": key.group(0), "public_certificate": cert.group(0)}
    if passphrase:
        cred["passphrase"] = passphrase
    return cred


class _Msal:
    def __init__(self, settings: OAuthSettings, *, http_client: Any = None, clock: Any = time.monotonic):
        self.settings = settings
        self.http_client = http_client
        self.clock = clock
        self._app: Any = None
        self._credential_digest = ""

    def _credential(self) -> Any:
        s = self.settings
        if s.certificate_file:
            return _certificate_credential(s.certificate_file, s.certificate_password)
        return s.client_secret.read() if s.client_secret else None

    def _make(self, confidential: bool, credential: Any) -> Any:
        msal = _msal()
        s = self.settings
        authority = f"{s.authority_host}/{s.tenant}"
        kwargs: dict[str, Any] = dict(authority=authority, timeout=s.timeout_seconds, token_cache=msal.TokenCache())
        if self.http_client is not None:
            kwargs["http_client"] = self.http_client
        try:
            if confidential:
                return msal.ConfidentialClientApplication(s.client_id, client_credential=credential, **kwargs)
            return msal.PublicClientApplication(s.client_id, **kwargs)
        except ValueError as exc:  # e.g. a bad authority, an unreadable key
            raise TokenError(f"MSAL refused the configuration: {exc}", "check tenant, authority_host and the "
                             "certificate file") from None
        except (OSError, msal.exceptions.MsalError, RuntimeError) as exc:
            # the discovery request failed: requests' errors are OSErrors; a 5xx is MSAL's
            # MsalServiceError ("HTTP Error: 503"), or a RuntimeError when raise_for_status() is silent
            raise TokenUnavailable(f"the Microsoft identity platform ({authority}) could not be reached: "
                                   f"{type(exc).__name__}") from None

    def _ensure_app(self, confidential: bool) -> None:
        """The MSAL application, made again when the secret or certificate (read anew
        each time, so a rotated file is picked up) changed; otherwise its cached
        access tokens are dropped, since fetch() is called only when the token is
        used up or was refused."""
        credential = self._credential() if confidential else None
        digest = hashlib.sha256(repr(credential).encode()).hexdigest()
        if self._app is None or digest != self._credential_digest:
            self._app = self._make(confidential, credential)
            self._credential_digest = digest
        else:
            self._forget_cached()

    def _forget_cached(self) -> None:
        cache = self._app.token_cache
        for item in list(cache.search(cache.CredentialType.ACCESS_TOKEN)):
            cache.remove_at(item)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        msal = _msal()
        try:
            result = getattr(self._app, method)(*args, **kwargs)
        except (OSError, ValueError, msal.exceptions.MsalError) as exc:
            # requests' ConnectionError/Timeout are OSErrors; MSAL raises ValueError for a response that
            # is not JSON (an HTML error page) and MsalServiceError for a 5xx it could not read
            raise TokenUnavailable(f"the Microsoft identity platform could not be reached: "
                                   f"{type(exc).__name__}") from None
        if not isinstance(result, dict):
            raise TokenUnavailable("the Microsoft identity platform gave no answer")
        if "access_token" not in result:
            raise explain_microsoft(result)
        return result


class ClientCredentials(_Msal):
    """Client credentials grant for Exchange Online SMTP AUTH."""

    def fetch(self) -> Token:
        self._ensure_app(confidential=True)
        return _token(self._call("acquire_token_for_client", scopes=list(self.settings.scopes)), self.clock)


class RefreshToken(_Msal):
    """A delegated mailbox's refresh token, redeemed with MSAL."""

    def __init__(self, settings: OAuthSettings, **kwargs: Any):
        super().__init__(settings, **kwargs)
        assert settings.refresh_token is not None
        self.stored = StoredRefreshToken(settings.refresh_token)

    def fetch(self) -> Token:
        self._ensure_app(confidential=self.settings.client_secret is not None)
        refresh = self.stored.current()
        result = self._call("acquire_token_by_refresh_token", refresh, scopes=list(self.settings.scopes))
        self.stored.rotated(refresh, result.get("refresh_token"))
        return _token(result, self.clock)
