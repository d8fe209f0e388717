"""One-click unsubscribe (RFC 8058) as a small WSGI application.

``POST <url with token>`` with the body ``List-Unsubscribe=One-Click`` (what
mailbox providers send, RFC 8058 section 3.2) verifies the token's signature
(:mod:`mailq_db.bounces.verp`, purpose ``u``) and records the unsubscribe
(mailq.RecordUnsubscribe): 200.  ``GET`` never unsubscribes -- link scanners
and previews fetch links (RFC 8058 section 1) -- it answers a page with a
button that POSTs the same form.  A token that does not verify: 404; a
mail purged since the link was sent: 410.  Nothing else is served.

The token is the last path segment of the URL (``.../unsubscribe/<token>``)
or its ``token`` query parameter, as the account's ``unsubscribe_url``
template puts it.  The endpoint must be reached over HTTPS (RFC 8058 section
3.1): run it behind the TLS proxy that serves that host name.

Mount it in an application: ``make_app(keys, recorder)``; or run it alone:
``mailq-db unsubscribe-server`` (wsgiref, one thread per request), or under
any WSGI server with ``mailq_db.bounces.unsubscribe:app_from_env()``.
"""

from __future__ import annotations

import html
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from ..errors import DatabaseError
from . import verp

log = logging.getLogger("mailq_db.bounces")

#: recorder(mail_id, recipient_no, source) -> the row of mailq.RecordUnsubscribe
Recorder = Callable[[int, int, str], dict[str, Any]]
MAX_BODY = 64 * 1024
ONE_CLICK = "List-Unsubscribe=One-Click"

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="robots" content="noindex">
<title>{title}</title></head>
<body><h1>{title}</h1><p>{text}</p>{form}</body></html>
"""
FORM = ('<form method="post"><input type="hidden" name="List-Unsubscribe" value="One-Click">'
        '<button type="submit">Unsubscribe</button></form>')


def _token(environ: dict[str, Any]) -> str:
    query = parse_qs(environ.get("QUERY_STRING", ""))
    if query.get("token"):
        return query["token"][0]
    parts = [p for p in (environ.get("PATH_INFO") or "").split("/") if p]
    return parts[-1] if parts else ""


def _body(environ: dict[str, Any]) -> str:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length <= 0 or length > MAX_BODY:
        return ""
    return environ["wsgi.input"].read(length).decode("utf-8", "replace")


def _one_click(environ: dict[str, Any], body: str) -> bool:
    """RFC 8058 3.2: the POST carries List-Unsubscribe=One-Click (urlencoded or
    multipart/form-data); our own confirmation form posts the same pair."""
    ctype = (environ.get("CONTENT_TYPE") or "").lower()
    if ctype.startswith("multipart/form-data"):
        return 'name="list-unsubscribe"' in body.lower() and "one-click" in body.lower()
    values = parse_qs(body)
    return "One-Click" in values.get("List-Unsubscribe", [])


class UnsubscribeApp:
    """The WSGI callable (see the module's docstring)."""

    def __init__(self, keys: Iterable[bytes], recorder: Recorder, *, source: str = "unsubscribe-url"):
        self.signer = verp.Signer(keys)
        self.recorder = recorder
        self.source = source

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        token = self.signer.verify(verp.UNSUBSCRIBE, _token(environ))
        if token is None or token.recipient_no < 1:
            return self._page(start_response, "404 Not Found", "Unknown link",
                              "This unsubscribe link is not valid.")
        if method == "GET" or method == "HEAD":
            return self._page(start_response, "200 OK", "Unsubscribe",
                              "Press the button to stop receiving these messages.", FORM)
        if method != "POST":
            return self._page(start_response, "405 Method Not Allowed", "Not allowed", "Use POST.",
                              extra=[("Allow", "GET, POST")])
        if not _one_click(environ, _body(environ)):
            return self._page(start_response, "400 Bad Request", "Bad request",
                              f"The request must carry {ONE_CLICK} (RFC 8058).")
        try:
            self.recorder(token.mail_id, token.recipient_no, self.source)
        except DatabaseError as exc:
            if exc.number == 50611:
                return self._page(start_response, "410 Gone", "Link expired",
                                  "This message is too old to be unsubscribed from here.")
            log.error("unsubscribe of mail %s not recorded: %s", token.mail_id, exc)
            return self._page(start_response, "503 Service Unavailable", "Try again later",
                              "The unsubscribe could not be recorded; please try again later.")
        log.info("unsubscribed: mail %s recipient %s", token.mail_id, token.recipient_no)
        return self._page(start_response, "200 OK", "Unsubscribed", "You will not receive these messages again.")

    @staticmethod
    def _page(start_response: Callable[..., Any], status: str, title: str, text: str, form: str = "",
              extra: list[tuple[str, str]] | None = None) -> list[bytes]:
        body = PAGE.format(title=html.escape(title), text=html.escape(text), form=form).encode("utf-8")
        headers = [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body))),
                   ("Cache-Control", "no-store"), ("X-Robots-Tag", "noindex"), *(extra or [])]
        start_response(status, headers)
        return [body]


def make_app(keys: Iterable[bytes], recorder: Recorder, *, source: str = "unsubscribe-url") -> UnsubscribeApp:
    return UnsubscribeApp(keys, recorder, source=source)


def database_recorder(connect: Callable[[], Any]) -> Recorder:
    """A recorder that calls mailq.RecordUnsubscribe on one connection, one request at a time."""
    from .. import procedures
    from ..connection import Backoff, ReconnectingConnection

    db = ReconnectingConnection(connect, backoff=Backoff(0.2, 5.0))
    lock = threading.Lock()

    def record(mail_id: int, recipient_no: int, source: str) -> dict[str, Any]:
        with lock:
            return db.call(procedures.record_unsubscribe, mail_id=mail_id, recipient_no=recipient_no,
                           source=source)
    return record


def app_from_env() -> UnsubscribeApp:
    """The app for any WSGI server: MAILQ_DB_URL and MAILQ_BOUNCE_KEY (MAILQ_BOUNCE_KEY_FILE)."""
    from ..connection import connect

    keys = verp.load_keys(os.environ, verp.DEFAULT_KEY_ENV, os.environ.get("MAILQ_BOUNCE_KEY_FILE"),
                          "MAILQ_BOUNCE_KEY_PREVIOUS")
    return make_app(keys, database_recorder(lambda: connect(None)))
