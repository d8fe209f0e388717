"""What a token provider raises, and the sentence that tells the operator what to fix.

An identity platform's refusal is explained from its documented error codes:

* Microsoft identity platform (Entra ID): the ``AADSTS`` numbers of
  https://learn.microsoft.com/en-us/entra/identity-platform/reference-error-codes
  (the token endpoint returns them in ``error_codes`` and ``error_description``);
* Google's token endpoint: the RFC 6749 5.2 ``error`` values with the meanings
  Google documents for service accounts with domain-wide delegation
  (https://developers.google.com/identity/protocols/oauth2/service-account) and
  for refresh tokens (https://developers.google.com/identity/protocols/oauth2#expiration).

No message built here ever contains a secret or a token: only error codes, the
identity platform's own description and the names of settings.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..classify import SetupError

#: AADSTS number -> what is missing and where to fix it (client credentials for
#: Exchange Online SMTP AUTH, and refresh tokens of delegated mailboxes).
AADSTS: dict[int, str] = {
    7000215: "the client secret is wrong (AADSTS7000215 invalid client secret): put the secret's Value, not its "
             "ID, from Entra ID > App registrations > Certificates & secrets in the configured secret",
    7000222: "the client secret has expired (AADSTS7000222): create a new secret under Certificates & secrets "
             "and put it in the configured secret",
    700016: "the application (client id) was not found in the tenant (AADSTS700016): check client_id and tenant, "
            "and that an administrator of that tenant consented to the application",
    65001: "consent is missing (AADSTS65001): an administrator must grant admin consent for the application's "
           "permissions (API permissions > Grant admin consent; for client credentials: Office 365 Exchange "
           "Online > Application permissions > SMTP.SendAsApp)",
    500011: "the resource is not in the tenant (AADSTS500011): request the scope "
            "https://outlook.office365.com/.default and make sure the tenant has Exchange Online; check the tenant",
    7000112: "the application is disabled in the tenant (AADSTS7000112): enable it under Enterprise applications "
             "> Properties > Enabled for users to sign-in",
    700027: "the certificate was refused (AADSTS700027 client assertion failed): upload this certificate's public "
            "part under Certificates & secrets of the application, or check that the key matches it",
    700024: "the client assertion is outside its valid time range (AADSTS700024): this machine's clock is "
            "wrong; synchronise it (NTP) - the certificate's signed assertion carries the time it was made",
    90002: "the tenant was not found (AADSTS90002): check tenant (a tenant ID or a verified domain such as "
           "contoso.onmicrosoft.com)",
    70011: "the scope is not valid (AADSTS70011): client credentials need https://outlook.office365.com/.default; a "
           "delegated mailbox needs https://outlook.office.com/SMTP.Send",
    7000218: "no credential was sent (AADSTS7000218): configure client_secret_env, client_secret_file or "
             "certificate_file",
    50034: "the user does not exist in the tenant (AADSTS50034): check the mailbox the refresh token belongs to",
    50076: "the refresh token needs multi-factor authentication again (AADSTS50076): sign the mailbox in again "
           "and store the new refresh token",
    70008: "the refresh token has expired or was revoked (AADSTS70008): sign the mailbox in again and store the "
           "new refresh token",
    700082: "the refresh token expired after being unused (AADSTS700082): sign the mailbox in again and store the "
            "new refresh token",
    50173: "the refresh token was revoked by a password change (AADSTS50173): sign the mailbox in again",
    53003: "a Conditional Access policy blocks the token (AADSTS53003): exclude this application or add a policy "
           "for workload identities",
}

#: Google token endpoint ``error`` -> explanation.
GOOGLE: dict[str, str] = {
    "unauthorized_client": "the service account is not authorized for this scope: in the Google Admin console "
                           "(Security > Access and data control > API controls > Domain-wide delegation) add the "
                           "service account's client ID with the scope https://mail.google.com/",
    "invalid_grant": "the grant was refused (invalid_grant): for a service account, check that the subject is an "
                     "existing mailbox of the Workspace domain, that the key is not deleted, and that this "
                     "machine's clock is right; for a refresh token, it was revoked or has expired: sign the "
                     "mailbox in again",
    "invalid_client": "the client is unknown or its secret is wrong (invalid_client): check client_id and the "
                      "client secret",
    "access_denied": "access was denied (access_denied): the user or an administrator must grant the scope",
    "invalid_scope": "the scope is not valid (invalid_scope): SMTP needs https://mail.google.com/",
}

#: RFC 6749 5.2 error codes that are not about configuration (worth a retry later).
TRANSIENT_ERRORS = frozenset({"temporarily_unavailable", "server_error"})


class MissingExtra(SetupError):
    """The optional dependency of a provider is not installed; the message names the extra."""


class TokenError(SetupError):
    """The token could not be obtained: a configuration, consent or credential problem.

    ``fix`` says what to check; the message carries it.  A :class:`SetupError`,
    so the worker classifies it as an account Wait (attempts refunded).
    """

    def __init__(self, message: str, fix: str | None = None, code: str | None = None):
        super().__init__(f"{message}; fix: {fix}" if fix else message)
        self.fix = fix
        self.code = code


class TokenUnavailable(ConnectionError):
    """The token endpoint (or the token command) could not be reached or answered
    with a transient error: the account waits briefly, like an unreachable server."""


def aadsts_codes(data: Mapping[str, Any]) -> list[int]:
    """The AADSTS numbers of a Microsoft error response (``error_codes``, else the description)."""
    codes = data.get("error_codes")
    if isinstance(codes, list) and all(isinstance(c, int) for c in codes):
        return list(codes)
    return [int(c) for c in re.findall(r"AADSTS(\d+)", str(data.get("error_description", "")))]


def first_line(text: Any, limit: int = 300) -> str:
    """The first line of an identity platform's description (without Trace/Correlation IDs)."""
    line = str(text or "").strip().splitlines()[0] if str(text or "").strip() else ""
    return line[:limit]


def explain_microsoft(data: Mapping[str, Any]) -> TokenError | TokenUnavailable:
    """A TokenError (or TokenUnavailable) for an MSAL/Entra error response."""
    error = str(data.get("error") or "error")
    description = first_line(data.get("error_description"))
    codes = aadsts_codes(data)
    fix = next((AADSTS[c] for c in codes if c in AADSTS), None)
    what = f"Microsoft identity platform refused the token request: {error}"
    if description:
        what += f" ({description})"
    if error in TRANSIENT_ERRORS:
        return TokenUnavailable(what)
    if fix is None:
        fix = {"invalid_client": "check client_id, the tenant and the secret or certificate",
               "unauthorized_client": "the application is not registered in the tenant or not allowed this "
                                      "grant: check client_id and tenant",
               "invalid_grant": "the refresh token is no longer valid: sign the mailbox in again and store the "
                                "new refresh token",
               "invalid_scope": AADSTS[70011]}.get(error, "see https://login.microsoftonline.com/error?code="
                                                         + (str(codes[0]) if codes else ""))
    return TokenError(what, fix, f"AADSTS{codes[0]}" if codes else error)


def explain_google(data: Mapping[str, Any] | None, message: str) -> TokenError | TokenUnavailable:
    """A TokenError for a google-auth RefreshError (its response data, or its message)."""
    data = data if isinstance(data, Mapping) else {}
    error = str(data.get("error") or "")
    if not error:
        m = re.match(r"\s*([a-z_]+)\s*:", message or "")
        error = m.group(1) if m else ""
    description = first_line(data.get("error_description") or message)
    what = f"the token endpoint refused the request: {error or 'error'}"
    if description and description != error:
        what += f" ({description})"
    if error in TRANSIENT_ERRORS:
        return TokenUnavailable(what)
    return TokenError(what, GOOGLE.get(error, "check the service account key or refresh token, client_id and "
                                               "the scope"), error or None)
