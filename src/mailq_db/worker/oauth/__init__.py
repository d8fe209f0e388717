"""OAuth 2.0 access tokens for SMTP AUTH (XOAUTH2 / OAUTHBEARER): providers, cache, errors.

One small module per provider (``microsoft``: MSAL client credentials and
refresh tokens; ``google``: google-auth service accounts and refresh tokens;
``command``: a program that prints a token), the per-process token cache
(``cache``), the ``[accounts.NAME.oauth]`` settings (``settings``) and the
explanations of the identity platforms' refusals (``errors``).  The SASL
exchange itself is :mod:`mailq_db.worker.sasl`.  Setup: docs/oauth2.md.

The optional libraries are imported only when a provider that needs them is
used: ``pip install 'mailq-db[oauth-microsoft]'`` (MSAL) or
``'mailq-db[oauth-google]'`` (google-auth).
"""

from __future__ import annotations

from typing import Any

from .cache import TOKENS, Provider, Token, TokenCache
from .errors import MissingExtra, TokenError, TokenUnavailable
from .settings import OAuthSettings, missing_extra, parse_oauth

__all__ = ["TOKENS", "MissingExtra", "OAuthSettings", "Provider", "Token", "TokenCache", "TokenError",
           "TokenUnavailable", "get_token", "make_provider", "missing_extra", "parse_oauth"]


def make_provider(settings: OAuthSettings, **deps: Any) -> Provider:
    """The provider for ``settings`` (``deps``: ``http_client`` for MSAL, ``request`` for google-auth)."""
    line = missing_extra(settings)
    if line:
        raise MissingExtra(line)
    if settings.provider == "microsoft":
        from .microsoft import ClientCredentials
        return ClientCredentials(settings, **deps)
    if settings.provider == "google":
        from .google import ServiceAccount
        return ServiceAccount(settings, **deps)
    if settings.provider == "refresh_token":
        if settings.issuer == "microsoft":
            from .microsoft import RefreshToken
            return RefreshToken(settings, **deps)
        from .google import RefreshToken as StandardRefreshToken
        return StandardRefreshToken(settings, **deps)
    from .command import Command
    return Command(settings)


def get_token(name: str, settings: OAuthSettings, cache: TokenCache = TOKENS) -> Token:
    """The account's cached token, or a new one (see :class:`TokenCache`)."""
    provider = cache.provider(name, lambda: make_provider(settings))
    return cache.get(name, provider, settings.refresh_margin_seconds)
