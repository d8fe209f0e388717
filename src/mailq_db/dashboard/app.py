"""The dashboard as a WSGI application: server-rendered pages, no JavaScript.

Why the standard library (wsgiref) and Jinja2, not a web framework: a dozen
GET pages and three confirmed POST actions need routing, a cookie, a form
parser and escaping; Jinja2 (already a dependency, autoescaping on) does the
escaping, and the rest is a few lines the tests read in full.  The app is
plain WSGI, so any WSGI server (gunicorn, waitress, uWSGI) can serve it
behind a reverse proxy instead of the bundled threaded wsgiref server.

Access (docs/monitoring/README.md, "Dashboard"):
  * a token (``MAILQ_DASHBOARD_TOKEN`` or a file) is asked once at /login and
    kept in an HttpOnly, SameSite=Strict cookie; ``Authorization: Bearer``
    works too.  Without a token the server only listens on a loopback address
    (put an authenticating reverse proxy in front for remote use), and it
    answers only requests whose Host is a loopback name or address (or one
    allowed by name): a web page whose DNS name is rebound to 127.0.0.1
    cannot read it through the operator's browser (DNS rebinding).
  * every link, form and redirect is relative, so the page works under any
    path prefix a reverse proxy mounts it at (``location /mailq/``).
  * actions (cancel or requeue the mails a filter lists, unblock an account)
    are off unless enabled; then each is a GET that lists what would change
    and a POST that does it, carrying a CSRF token bound to the session, the
    action and the exact mail IDs or account confirmed; the database refuses
    a login without the grants (MailqAdmin), and the page says so.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
import socket
import socketserver
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from http import HTTPStatus
from importlib import resources
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import jinja2

from ..errors import DatabaseError
from ..worker.smtp import queue_id
from .data import CANCELLABLE, REQUEUEABLE, ActionRefused, DashboardData

log = logging.getLogger("mailq_db.dashboard")

COOKIE = "mailq_dashboard"
#: largest form body read (a confirmed action carries at most 1,000 IDs)
MAX_BODY = 64 * 1024
STATUSES = CANCELLABLE + REQUEUEABLE
SECURITY_HEADERS = [
    ("Content-Security-Policy",
     "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
     "base-uri 'self'"),
    ("X-Frame-Options", "DENY"),  # frame-ancestors' counterpart for browsers without CSP level 2
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]

#: the alert rules' thresholds (docs/monitoring/alerts.yml; a test keeps them in step): the
#: summary marks a figure beyond them as the alert would
OLDEST_SENDABLE_ALERT_SECONDS = 900
FAILURE_RATIO_ALERT = 0.2
FAILURE_RATIO_MIN_PER_MINUTE = 1.0
FAILED = ("Retry", "Wait", "Stop", "Abandoned")

StartResponse = Callable[..., Any]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The host name of a Host header (``name``, ``name:port``, ``[::1]:port``), lower case."""
    try:
        name = urllib.parse.urlsplit("//" + header).hostname
    except ValueError:
        return None
    return name.rstrip(".") if name else None


def relative_root(path: str) -> str:
    """The relative URL of the application's root from ``path``: "./" from /mail,
    "../" from /actions/cancel.  Links, forms and redirects use it, so the page
    works wherever a proxy mounts it."""
    depth = max(path.count("/") - 1, 0)
    return "../" * depth if depth else "./"


def _age(seconds: Any) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _when(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("mailq_db.dashboard", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["age"] = _age
    env.filters["when"] = _when
    env.globals["queue_id"] = queue_id
    return env


@dataclass
class Response:
    status: HTTPStatus
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


class Request:
    def __init__(self, environ: dict[str, Any]) -> None:
        self.environ = environ
        self.method = environ.get("REQUEST_METHOD", "GET").upper()
        self.path = environ.get("PATH_INFO", "/") or "/"
        self.query = {k: v[0] for k, v in urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).items()}
        self._form: dict[str, str] | None = None

    def form(self) -> dict[str, str]:
        if self._form is None:
            try:
                size = min(int(self.environ.get("CONTENT_LENGTH") or 0), MAX_BODY)
            except ValueError:
                size = 0
            body = self.environ["wsgi.input"].read(size).decode("utf-8", "replace") if size else ""
            self._form = {k: v[0] for k, v in urllib.parse.parse_qs(body).items()}
        return self._form

    def cookie(self, name: str) -> str | None:
        for part in self.environ.get("HTTP_COOKIE", "").split(";"):
            key, _, value = part.strip().partition("=")
            if key == name:
                return value
        return None


class Dashboard:
    """The WSGI application.  ``data`` is the only way to the database."""

    def __init__(self, data: DashboardData, *, token: str | None, allow_actions: bool = False,
                 cookie_secure: bool = False, max_rows: int = 100, secret: bytes | None = None,
                 allowed_hosts: Iterable[str] = ()) -> None:
        self.data = data
        self.token = token
        #: without a token: Host names answered besides loopback ones (a proxy that sends its own)
        self.allowed_hosts = {h.lower().rstrip(".") for h in allowed_hosts}
        self.allow_actions = allow_actions
        self.cookie_secure = cookie_secure
        self.max_rows = max_rows
        self.secret = secret or secrets.token_bytes(32)
        self.env = _environment()
        self.routes: dict[tuple[str, str], Callable[[Request], Response]] = {
            ("GET", "/"): self.overview,
            ("GET", "/mail"): self.mail,
            ("GET", "/find"): self.find,
            ("GET", "/actions/cancel"): lambda r: self.confirm_mails(r, "cancel"),
            ("GET", "/actions/requeue"): lambda r: self.confirm_mails(r, "requeue"),
            ("POST", "/actions/cancel"): lambda r: self.do_mails(r, "cancel"),
            ("POST", "/actions/requeue"): lambda r: self.do_mails(r, "requeue"),
            ("GET", "/actions/unblock"): self.confirm_unblock,
            ("POST", "/actions/unblock"): self.do_unblock,
        }

    # ------------------------------------------------------------ plumbing

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        response = self.dispatch(request)
        headers = [("Content-Type", response.content_type), ("Content-Length", str(len(response.body))),
                   *SECURITY_HEADERS, *response.headers]
        start_response(f"{response.status.value} {response.status.phrase}", headers)
        return [response.body]

    def dispatch(self, request: Request) -> Response:
        if not self.host_allowed(request):
            return Response(HTTPStatus.FORBIDDEN, b"This Host is not served without a token: use 127.0.0.1 or "
                            b"localhost, or start the dashboard with --allow-host NAME.\n",
                            "text/plain; charset=utf-8")
        if request.path == "/healthz":
            return Response(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
        if request.path == "/static/style.css":
            css = resources.files("mailq_db.dashboard").joinpath("static/style.css").read_bytes()
            return Response(HTTPStatus.OK, css, "text/css; charset=utf-8")
        if request.path == "/login":
            return self.login(request)
        if not self.authenticated(request):
            if request.method == "GET":
                return Response(HTTPStatus.SEE_OTHER, b"",
                                headers=(("Location", relative_root(request.path) + "login"),))
            return self.page(request, "error.html", HTTPStatus.UNAUTHORIZED, message="Log in first.")
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            return self.page(request, "error.html", HTTPStatus.NOT_FOUND, message=f"No page {request.path}.")
        try:
            return handler(request)
        except ActionRefused as exc:
            return self.page(request, "error.html", HTTPStatus.FORBIDDEN, refused=True,
                             message=f"The database refused: {exc}")
        except DatabaseError as exc:
            log.warning("database error on %s: %s", request.path, exc)
            return self.page(request, "error.html", HTTPStatus.BAD_GATEWAY, message=f"Database error: {exc}")

    def page(self, request: Request, template: str, code: HTTPStatus = HTTPStatus.OK, **values: Any) -> Response:
        values.setdefault("root", relative_root(request.path))
        values.setdefault("actions", self.allow_actions)
        values.setdefault("logged_in", self.token is not None)
        values.setdefault("refused", False)
        body = self.env.get_template(template).render(**values).encode("utf-8")
        return Response(code, body)

    # ---------------------------------------------------------------- auth

    def host_allowed(self, request: Request) -> bool:
        """With a token, any Host (the token guards the page).  Without one, only a
        loopback Host or one allowed by name: the browser of an operator who has
        the page open on 127.0.0.1 sends a rebound name's Host, which is refused."""
        if self.token is not None:
            return True
        header = request.environ.get("HTTP_HOST")
        if header is None:
            return True  # HTTP/1.0 without Host: not a browser
        name = host_name(header)
        return name is not None and (is_loopback(name) or name in self.allowed_hosts)

    def _session(self) -> str:
        """The cookie value a login grants (changes when the token or the process changes)."""
        return hmac.new(self.secret, b"session|" + (self.token or "").encode(), hashlib.sha256).hexdigest()

    def authenticated(self, request: Request) -> bool:
        if self.token is None:
            return True  # loopback only, enforced by serve()
        bearer = request.environ.get("HTTP_AUTHORIZATION", "")
        if bearer.startswith("Bearer ") and hmac.compare_digest(bearer[7:].encode(), self.token.encode()):
            return True
        cookie = request.cookie(COOKIE)
        return cookie is not None and hmac.compare_digest(cookie.encode(), self._session().encode())

    def login(self, request: Request) -> Response:
        if self.token is None:
            return Response(HTTPStatus.SEE_OTHER, b"", headers=(("Location", relative_root(request.path)),))
        if request.method != "POST":
            return self.page(request, "login.html", failed=False)
        given = request.form().get("token", "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return self.page(request, "login.html", HTTPStatus.UNAUTHORIZED, failed=True)
        # No Path: the browser scopes the cookie to the directory of /login, the
        # page's mount point behind a proxy ("/mailq"), "/" when served directly.
        cookie = f"{COOKIE}={self._session()}; HttpOnly; SameSite=Strict"
        if self.cookie_secure:
            cookie += "; Secure"
        return Response(HTTPStatus.SEE_OTHER, b"",
                        headers=(("Location", relative_root(request.path)), ("Set-Cookie", cookie)))

    def csrf(self, action: str, payload: str) -> str:
        message = f"csrf|{self._session()}|{action}|{payload}".encode()
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()

    def csrf_ok(self, request: Request, action: str, payload: str) -> bool:
        given = request.form().get("csrf", "")
        return hmac.compare_digest(given.encode(), self.csrf(action, payload).encode())

    # --------------------------------------------------------------- pages

    def overview(self, request: Request) -> Response:
        view = self.data.overview()
        m = view.metrics
        minutes = 1.0
        if m.window_start_utc is not None and m.window_end_utc is not None:
            minutes = max(1.0, (m.window_end_utc - m.window_start_utc).total_seconds() / 60)
        queue = queue_rows(m)
        return self.page(request, "overview.html", m=m, delay=view.delay, queue=queue,
                         summary=summary(m, queue, view.delay, minutes), throughput=throughput_rows(m),
                         failures=failure_rows(m, minutes), minutes=minutes, statuses=STATUSES)

    def mail(self, request: Request) -> Response:
        mail_id = _int(request.query.get("id"))
        if mail_id is None:
            return self.page(request, "error.html", HTTPStatus.BAD_REQUEST, message="Give a mail ID: /mail?id=123")
        story = self.data.mail_story(mail_id)
        if story.history.mail is None:
            return self.page(request, "error.html", HTTPStatus.NOT_FOUND, message=f"No mail {mail_id}.")
        return self.page(request, "mail.html", h=story.history, events=story.events)

    def _filter(self, request: Request) -> tuple[str, str | None, str | None]:
        status = request.query.get("status", "Failed")
        return status, request.query.get("account") or None, request.query.get("run_mode") or None

    def find(self, request: Request) -> Response:
        status, account, run_mode = self._filter(request)
        if status not in STATUSES:
            return self.page(request, "error.html", HTTPStatus.BAD_REQUEST, message=f"Unknown status {status!r}.")
        rows = self.data.find_mail(status=status, account_name=account, run_mode=run_mode, max_rows=self.max_rows)
        return self.page(request, "find.html", rows=rows, status=status, account=account or "", run_mode=run_mode or "",
                         statuses=STATUSES, max_rows=self.max_rows)

    # ------------------------------------------------------------- actions

    def _actions_off(self, request: Request) -> Response | None:
        if not self.allow_actions:
            return self.page(request, "error.html", HTTPStatus.FORBIDDEN,
                             message="Actions are off: start the dashboard with --allow-actions.")
        return None

    def _require_admin(self) -> None:
        """The confirm step's check (IS_ROLEMEMBER through mailq.GetQueueMetrics); the
        database refuses the calls themselves (229) to any other login anyway."""
        if not self.data.caller_is_admin():
            raise ActionRefused("the dashboard's database login is not a member of MailqAdmin")

    def confirm_mails(self, request: Request, action: str) -> Response:
        off = self._actions_off(request)
        if off:
            return off
        self._require_admin()
        status, account, run_mode = self._filter(request)
        allowed = CANCELLABLE if action == "cancel" else REQUEUEABLE
        if status not in allowed:
            return self.page(request, "error.html", HTTPStatus.BAD_REQUEST,
                             message=f"{action} applies to {', '.join(allowed)} mail, not {status}.")
        rows = self.data.find_mail(status=status, account_name=account, run_mode=run_mode, max_rows=self.max_rows)
        ids = ",".join(str(r["ID"]) for r in rows)
        return self.page(request, "confirm.html", action=action, rows=rows, ids=ids, status=status,
                         account=account or "(every account)", csrf=self.csrf(action, ids))

    def do_mails(self, request: Request, action: str) -> Response:
        off = self._actions_off(request)
        if off:
            return off
        form = request.form()
        ids_text = form.get("ids", "")
        if form.get("confirm") != "yes" or not self.csrf_ok(request, action, ids_text):
            return self.page(request, "error.html", HTTPStatus.FORBIDDEN,
                             message="Not confirmed, or the form is stale: list the mails again.")
        ids = [int(i) for i in ids_text.split(",") if i.strip().isdigit()]
        outcome = self.data.cancel(ids) if action == "cancel" else self.data.requeue(ids)
        return self.page(request, "done.html", action=action, outcome=outcome)

    def confirm_unblock(self, request: Request) -> Response:
        off = self._actions_off(request)
        if off:
            return off
        self._require_admin()
        account = request.query.get("account", "")
        if not account:
            return self.page(request, "error.html", HTTPStatus.BAD_REQUEST, message="Name the account: ?account=NAME")
        return self.page(request, "confirm_unblock.html", account=account, csrf=self.csrf("unblock", account))

    def do_unblock(self, request: Request) -> Response:
        off = self._actions_off(request)
        if off:
            return off
        form = request.form()
        account = form.get("account", "")
        if form.get("confirm") != "yes" or not self.csrf_ok(request, "unblock", account):
            return self.page(request, "error.html", HTTPStatus.FORBIDDEN,
                             message="Not confirmed, or the form is stale: open the account again.")
        made_visible = self.data.unblock(account)
        return self.page(request, "done_unblock.html", account=account, made_visible=made_visible)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def queue_rows(m: Any) -> list[dict[str, Any]]:
    """One row per (account, run mode): UnSent and Sending counts beside the sendable figures."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in m.sendable:
        rows[(r["AccountName"], r["RunMode"])] = {**r, "UnSent": 0, "Sending": 0}
    for r in m.depth:
        row = rows.setdefault((r["AccountName"], r["RunMode"]), {
            "AccountName": r["AccountName"], "RunMode": r["RunMode"], "DueCount": 0, "SendableCount": 0,
            "IsBlocked": False, "OldestSendableAgeSeconds": 0, "UnSent": 0, "Sending": 0})
        row[r["Status"]] = int(r["MailCount"])
    return [rows[k] for k in sorted(rows)]


def summary(m: Any, queue: list[dict[str, Any]], delay: dict[str, Any] | None, minutes: float) -> dict[str, Any]:
    """The figures an operator reads first, each marked ``bad`` the way its alert
    would judge it: the oldest sendable mail, what is queued, the failure ratio
    over the window (overall and the worst account), blocked accounts, overdue
    delayed tasks."""
    worst = max((r for r in queue if r["SendableCount"]), key=lambda r: r["OldestSendableAgeSeconds"], default=None)
    attempts: dict[str, list[int]] = {}  # account -> [failed, all but Released]
    for r in m.attempts:
        if r["Outcome"] == "Released":
            continue
        counts = attempts.setdefault(r["AccountName"], [0, 0])
        counts[1] += int(r["Attempts"])
        if r["Outcome"] in FAILED:
            counts[0] += int(r["Attempts"])
    failed = sum(c[0] for c in attempts.values())
    total = sum(c[1] for c in attempts.values())
    ratios = [(c[0] / c[1], account) for account, c in attempts.items()
              if c[1] / minutes >= FAILURE_RATIO_MIN_PER_MINUTE]
    worst_ratio = max(ratios, default=None)
    blocked = [a["AccountName"] for a in m.accounts if a["IsBlocked"]]
    overdue = int(delay.get("OverdueTasks") or 0) if delay else None
    return {
        "oldest": worst, "oldest_bad": bool(worst and worst["OldestSendableAgeSeconds"] > OLDEST_SENDABLE_ALERT_SECONDS),
        "sendable": sum(int(r["SendableCount"]) for r in queue), "due": sum(int(r["DueCount"]) for r in queue),
        "unsent": sum(int(r["UnSent"]) for r in queue), "sending": sum(int(r["Sending"]) for r in queue),
        "ratio": failed / total if total else None, "failed_per_minute": failed / minutes,
        "attempts_per_minute": total / minutes, "worst_ratio": worst_ratio,
        "ratio_bad": bool(worst_ratio and worst_ratio[0] > FAILURE_RATIO_ALERT),
        "blocked": blocked, "overdue": overdue,
        "delay_bad": bool(delay and (overdue or delay.get("QueueReceiveEnabled") == 0 or delay.get("BrokerEnabled") == 0)),
    }


def throughput_rows(m: Any) -> list[dict[str, Any]]:
    """Per minute and account: attempts sent (Sent, DryRun) and failed (Retry, Wait, Stop, Abandoned)."""
    rows: dict[tuple[Any, str], dict[str, Any]] = {}
    for r in m.attempts:
        row = rows.setdefault((r["MinuteUtc"], r["AccountName"]),
                              {"MinuteUtc": r["MinuteUtc"], "AccountName": r["AccountName"], "Sent": 0, "Failed": 0})
        if r["Outcome"] in ("Sent", "DryRun"):
            row["Sent"] += int(r["Attempts"])
        elif r["Outcome"] in ("Retry", "Wait", "Stop", "Abandoned"):
            row["Failed"] += int(r["Attempts"])
    return [rows[k] for k in sorted(rows, reverse=True)]


def failure_rows(m: Any, minutes: float) -> list[dict[str, Any]]:
    """Failed attempts in the window by account, outcome and reply class, most first."""
    totals: dict[tuple[str, str, str], int] = {}
    for r in m.attempts:
        if r["Outcome"] in ("Retry", "Wait", "Stop", "Abandoned"):
            key = (r["AccountName"], r["Outcome"], r["ReplyClass"])
            totals[key] = totals.get(key, 0) + int(r["Attempts"])
    return [{"AccountName": a, "Outcome": o, "ReplyClass": c, "Attempts": n, "PerMinute": n / minutes}
            for (a, o, c), n in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # http.server's server_bind asks socket.getfqdn(), a DNS lookup that
        # can take seconds; the page never uses the name.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)


def make_dashboard_server(app: Dashboard, host: str, port: int) -> WSGIServer:
    """A threaded wsgiref server for ``app``; refuses a non-loopback address without a token."""
    if app.token is None and not is_loopback(host):
        raise ValueError(f"refusing to serve the dashboard on {host} without a token: set "
                         "MAILQ_DASHBOARD_TOKEN (or --token-file), or listen on 127.0.0.1 behind an "
                         "authenticating reverse proxy")

    server_class: type[WSGIServer] = _ThreadingServer
    if ":" in host:
        class _V6(_ThreadingServer):
            address_family = socket.AF_INET6

        server_class = _V6
    return make_server(host, port, app, server_class=server_class, handler_class=_Quiet)
