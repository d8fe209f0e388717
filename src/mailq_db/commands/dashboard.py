"""``mailq-db dashboard``: a read-only web page of the queue, actions only when enabled."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Mapping

from ..connection import ENV_URL, connect
from ..errors import ConfigurationError
from ..worker import logs
from . import serve_until_stopped

ENV_TOKEN = "MAILQ_DASHBOARD_TOKEN"
DEFAULT_PORT = 8470
MIN_TOKEN = 16

HELP = f"""\
Serve a read-only web page of the queue: depth and age of the oldest
sendable mail by account, throughput per minute, failures by SMTP reply
class, blocked accounts and why, delayed tasks, and one mail's whole story
(its events, attempts with the relay's queue ID, and recipients' outcomes).
Rendered on the server: no JavaScript, nothing loaded from elsewhere.

Access: the token in ${ENV_TOKEN} (or the first line of --token-file, at
least {MIN_TOKEN} characters) is asked once and kept in a cookie.  Without a
token the page listens on a loopback address only and answers only requests
whose Host is a loopback name or address (a web page rebinding its DNS name
to 127.0.0.1 cannot read it through your browser); put an authenticating
reverse proxy in front of it for remote use (docs/monitoring/README.md), and
name the Host it sends with --allow-host if it is not the loopback address.

Actions (cancel or requeue the mails a filter lists, unblock an account) are
off unless --allow-actions; each is listed and confirmed first, and the
database refuses them unless the login is a member of MailqAdmin.  The login
needs MailqMonitor for the read-only page.

The database URL comes from --db, else ${ENV_URL}.

examples:
  mailq-db dashboard                                   # http://127.0.0.1:{DEFAULT_PORT}/
  mailq-db dashboard --host 0.0.0.0 --cookie-secure  # the token in $MAILQ_DASHBOARD_TOKEN
  mailq-db dashboard --token-file /etc/mailq/dashboard.token --allow-actions
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("dashboard", help="a read-only web page of the queue",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", help=f"database URL (default: ${ENV_URL})")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0: one the OS chooses)")
    p.add_argument("--token-file", metavar="FILE", help=f"read the token from FILE instead of ${ENV_TOKEN}")
    p.add_argument("--allow-actions", action="store_true",
                   help="enable cancel/requeue by filter and unblock (MailqAdmin logins only, confirmed)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="without a token, also answer requests for Host NAME (a reverse proxy that sends its own "
                   "Host); repeatable")
    p.add_argument("--cookie-secure", action="store_true",
                   help="mark the login cookie Secure (when served over HTTPS, e.g. behind a proxy)")
    p.add_argument("--window-minutes", type=int, default=15, choices=range(1, 61), metavar="N",
                   help="complete minutes of throughput shown (default 15; 1-60)")
    p.add_argument("--max-rows", type=int, default=100, choices=range(1, 1001), metavar="N",
                   help="mails listed by a search or an action (default 100; 1-1000)")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO")
    p.set_defaults(func=run)


def read_token(token_file: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The dashboard token: the first line of ``token_file``, else $MAILQ_DASHBOARD_TOKEN, else None."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    if token_file:
        try:
            lines = Path(token_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigurationError(f"--token-file {token_file}: {exc.strerror}") from None
        token = lines[0].strip() if lines else ""
    else:
        token = env.get(ENV_TOKEN, "").strip()
        if not token:
            return None
    if len(token) < MIN_TOKEN:
        raise ConfigurationError(f"the dashboard token must be at least {MIN_TOKEN} characters "
                                 "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token


def run(args: argparse.Namespace) -> int:
    from ..dashboard.app import Dashboard, make_dashboard_server
    from ..dashboard.data import DatabaseData

    logs.setup(args.log_format, args.log_level)
    token = read_token(args.token_file)
    url = args.db

    def open_connection() -> Any:
        return connect(url, query_timeout=30)

    open_connection().close()  # fail fast on a missing driver, a wrong URL or login
    app = Dashboard(DatabaseData(open_connection, window_minutes=args.window_minutes), token=token,
                    allow_actions=args.allow_actions, cookie_secure=args.cookie_secure, max_rows=args.max_rows,
                    allowed_hosts=args.allow_host)
    try:
        server = make_dashboard_server(app, args.host, args.port)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(f"dashboard on http://{host}:{port}/ ({'token required' if token else 'no token: loopback only'}; "
          f"actions {'ENABLED' if args.allow_actions else 'off'}); Ctrl-C stops", flush=True)
    serve_until_stopped(server, "dashboard")
    return 0
