"""``mailq-db worker``: run the sender worker (or check its configuration)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
import sys

from .. import procedures
from ..connection import ENV_URL, connect, find_driver, installed_drivers
from ..errors import ConfigurationError, MailqError
from ..worker import logs
from ..worker.config import Config, check_run_modes, is_fqdn, load_config, secret_file_warnings
from ..worker.probe import probe
from ..worker.runner import run_workers

HELP = """\
Run the sender worker: claim due mails, send each account's mails over one SMTP
connection, acknowledge them, classify failures as Retry/Wait/Stop, extend
leases, and stop gracefully on SIGTERM/SIGINT (the mail in flight is finished,
the unsent ones are released). Run as many workers on as many machines as you
like: the database hands each mail to one of them and enforces the rate limits.

The database URL comes from --db, else $MAILQ_DB_URL, else [database] in the
config. SMTP passwords come from the environment variables the config names;
accounts with auth = "xoauth2" sign in with OAuth 2.0 tokens (docs/oauth2.md).

examples:
  mailq-db worker --config worker.toml --check-config
  mailq-db check-config --config worker.toml --probe    # and talk to each account's server
  mailq-db worker --config worker.toml
  mailq-db worker --config worker.toml --concurrency 8 --log-format json --metrics-port 9464
  mailq-db worker --config worker.toml --dry-run --once     # drain what is due, send nothing
  mailq-db worker --config worker.toml --run-mode staging --run-mode test   # serve these run modes only

--run-mode (repeat) replaces [worker] run_modes of the config: the worker claims
mail of those run modes only (default ["prod"]; docs/run-modes.md).
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("worker", help="run the sender worker", description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, metavar="FILE", help="worker TOML file (see examples/worker.toml)")
    p.add_argument("--db", help=f"database URL (default: ${ENV_URL}, then [database] in the config)")
    p.add_argument("--check-config", action="store_true",
                   help="validate the config, explain each problem, and exit (non-zero on problems)")
    p.add_argument("--probe", action="store_true",
                   help="with --check-config: connect to each account's server (TCP, EHLO, STARTTLS with "
                   "the certificate checked, AUTH, QUIT) and report each step")
    p.add_argument("--dry-run", action="store_true", help="send nothing; record the mails as dry-run sent")
    p.add_argument("--run-mode", action="append", default=[], metavar="NAME", dest="run_modes",
                   help="serve this run mode (repeat); replaces [worker] run_modes (default: prod)")
    p.add_argument("--once", action="store_true", help="process what is due now, then exit")
    p.add_argument("--concurrency", type=_positive, metavar="N", help="worker threads (overrides the config)")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO")
    p.add_argument("--metrics-port", type=_port, metavar="PORT",
                   help="serve Prometheus metrics on http://HOST:PORT/metrics")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 for remote scraping)")
    p.set_defaults(func=run)

    c = subparsers.add_parser(
        "check-config", help="check a worker config (--probe: and each account's server)",
        description="Validate a worker TOML file and explain each problem; with --probe, connect to each "
        "account's SMTP server the way the worker will (TCP, EHLO, STARTTLS with the certificate checked, "
        "one AUTH (after fetching the token, for an OAuth 2.0 account), QUIT) and report each step with "
        "what to fix. Same as `mailq-db worker --check-config`.",
        epilog="examples:\n  mailq-db check-config --config worker.toml --probe",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--config", required=True, metavar="FILE", help="worker TOML file (see examples/worker.toml)")
    c.add_argument("--db", help=f"database URL (default: ${ENV_URL}, then [database] in the config)")
    c.add_argument("--probe", action="store_true", help="connect to each account's server and report each step")
    c.set_defaults(func=check)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= 256:
        raise argparse.ArgumentTypeError(f"must be 1-256, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {value}")
    return value


def with_run_modes(config: Config, run_modes: list[str] | None) -> Config:
    """``config`` with [worker] run_modes replaced by --run-mode's (when given)."""
    if not run_modes:
        return config
    problems = check_run_modes(run_modes)
    if problems:
        raise ConfigurationError("--run-mode: " + "; ".join(problems))
    modes = tuple(dict.fromkeys(run_modes))
    return dataclasses.replace(config, worker=dataclasses.replace(config.worker, run_modes=modes))


def database_url(args: argparse.Namespace, config: Config) -> str | None:
    return args.db or os.environ.get(ENV_URL) or config.database.url


def describe(config: Config, url: str | None) -> str:
    w = config.worker
    lines = [
        "worker: batch_size={0.batch_size} lease_seconds={0.lease_seconds} "
        "lease_safety_margin_seconds={0.lease_safety_margin_seconds} concurrency={0.concurrency} "
        "idle_backoff={0.idle_backoff_min_seconds}-{0.idle_backoff_max_seconds}s dry_run={0.dry_run}".format(w),
        f"run modes: {', '.join(w.run_modes)}",
        f"application: {w.app_name or '(none: competes for every application)'}",
        f"database: {'set' if url else 'NOT SET'}",
    ]
    for a in config.accounts.values():
        login = f"user {a.user} (password from ${a.password_env})" if a.user else "no login"
        if a.user and a.oauth is not None:
            login = f"user {a.user} ({a.auth.upper()}, token from provider {a.oauth.provider})"
        dkim = f" dkim d={a.dkim.domain} s={a.dkim.selector}" if a.dkim else ""
        lines.append(f"account {a.name}: {a.host}:{a.port} tls={a.tls} {login}{dkim} "
                     f"timeouts connect={a.connect_timeout_seconds}s command={a.command_timeout_seconds}s")
    return "\n".join(lines)


def check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigurationError as exc:
        print(f"config problems:\n{exc}", file=sys.stderr)
        return 1
    url = database_url(args, config)
    print(describe(config, url))
    problems = []
    if not url:
        problems.append(f"no database: pass --db, set {ENV_URL}, or add [database] url_env to the config")
    try:
        find_driver(installed_drivers())
    except MailqError as exc:
        problems.append(str(exc))
    for a in config.accounts.values():
        helo = a.local_hostname or socket.getfqdn()
        if not is_fqdn(helo):
            print(f"warning: account {a.name}: the EHLO name {helo!r} is not a fully qualified domain name; "
                  "set local_hostname (Postfix's reject_non_fqdn_helo_hostname refuses it)", file=sys.stderr)
    for line in secret_file_warnings(config):
        print(f"warning: {line}", file=sys.stderr)
    failed = False
    if getattr(args, "probe", False):
        steps, ok = probe(config.accounts)
        for step in steps:
            print(step.line())
        if not ok:
            failed = True
            problems.append("the probe failed: see the FAIL lines above")
    if problems:
        print("problems:\n" + "\n".join(f"  - {p}" for p in problems), file=sys.stderr)
        return 1
    print("config OK" + (" (servers probed)" if getattr(args, "probe", False) and not failed else ""))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.check_config:
        return check(args)
    config = with_run_modes(load_config(args.config), getattr(args, "run_modes", None))
    url = database_url(args, config)
    if not url:
        raise ConfigurationError(f"no database: pass --db, set {ENV_URL}, or add [database] to the config")
    logs.setup(args.log_format, args.log_level)
    for line in secret_file_warnings(config):
        logs.event(logging.getLogger("mailq_db.worker"), logging.WARNING, line)
    db = config.database

    def open_connection():
        return connect(url, timeout=db.connect_timeout_seconds, query_timeout=db.query_timeout_seconds)

    open_connection().close()  # fail fast on a missing driver, a wrong URL or login
    return run_workers(
        config, open_connection, procs=procedures, once=args.once, concurrency=args.concurrency,
        dry_run=True if args.dry_run else None, metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
