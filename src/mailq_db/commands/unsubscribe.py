"""``mailq-db unsubscribe-server``: the RFC 8058 one-click endpoint as a small HTTP server."""

from __future__ import annotations

import argparse
import logging
import os
import socketserver
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..bounces import unsubscribe, verp
from ..connection import connect
from ..errors import ConfigurationError
from . import serve_until_stopped

HELP = """\
Serve the one-click unsubscribe links of bulk mail (RFC 8058; docs/bounces.md):
POST with List-Unsubscribe=One-Click records the unsubscribe
(mailq.RecordUnsubscribe, role MailqBounceReader); GET shows a confirmation
button and never unsubscribes by itself.  Put it behind the HTTPS proxy of
the host name in the accounts' unsubscribe_url.  The signing key comes from
$MAILQ_BOUNCE_KEY (or $MAILQ_BOUNCE_KEY_FILE; $MAILQ_BOUNCE_KEY_PREVIOUS
during a key rotation), the database from --db or $MAILQ_DB_URL.  To mount
the endpoint in your own WSGI application or server instead:
mailq_db.bounces.unsubscribe.make_app(keys, recorder) or app_from_env().

examples:
  mailq-db unsubscribe-server --listen 127.0.0.1:8025
"""


class ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        logging.getLogger("mailq_db.bounces").info("%s %s", self.address_string(), format % args)


def register(subparsers) -> None:
    p = subparsers.add_parser("unsubscribe-server", help="serve RFC 8058 one-click unsubscribe links",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default="127.0.0.1:8025", metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:8025; port 0: any free port)")
    p.add_argument("--db", help="database URL (default: $MAILQ_DB_URL)")
    p.set_defaults(func=run)


def build_server(listen: str, app: unsubscribe.UnsubscribeApp) -> WSGIServer:
    host, _, port = listen.rpartition(":")
    try:
        number = int(port)
    except ValueError as exc:
        raise ConfigurationError(f"--listen must be HOST:PORT, got {listen!r}") from exc
    return make_server(host or "127.0.0.1", number, app, server_class=ThreadingServer, handler_class=QuietHandler)


def run(args) -> int:
    keys = verp.load_keys(os.environ, verp.DEFAULT_KEY_ENV, os.environ.get("MAILQ_BOUNCE_KEY_FILE"),
                          "MAILQ_BOUNCE_KEY_PREVIOUS")
    if not keys:
        raise ConfigurationError("set MAILQ_BOUNCE_KEY (or MAILQ_BOUNCE_KEY_FILE): the key the workers sign "
                                 "unsubscribe links with")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = unsubscribe.make_app(keys, unsubscribe.database_recorder(lambda: connect(args.db)))
    server = build_server(args.listen, app)
    host, port = server.server_address[:2]
    print(f"unsubscribe-server listening on {host!s}:{port}", flush=True)
    serve_until_stopped(server, "unsubscribe-server")
    return 0
