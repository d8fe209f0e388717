"""``mailq-db import-dbmail``: copy Database Mail's accounts and profiles into mailq-db.

Reads, read-only, msdb's documented Database Mail tables on a source server
(``msdb.dbo.sysmail_profile``, ``sysmail_account``, ``sysmail_server``,
``sysmail_profileaccount``, ``sysmail_principalprofile``), creates the
matching sending accounts, profiles, profile accounts and principal grants in
the mailq-db database through :mod:`mailq_db.procedures`, and writes a worker
configuration skeleton.  msdb never gives SMTP passwords back, so each account
that logs in gets a ``password_env`` placeholder, marked ``PLACEHOLDER``, that
``mailq-db worker --check-config`` refuses until the variable is set.  Accounts
on Microsoft 365, Outlook.com or Gmail, which take no passwords for SMTP, get a
commented OAuth 2.0 template instead (``auth = "xoauth2"``, refused until the
``oauth`` table is filled in; docs/oauth2.md).

The msdb reads are plain SELECTs on msdb's own tables (not our data, so they do
not go through ``procedures``); everything written goes through ``procedures``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import quote, urlsplit, urlunsplit

from .. import procedures
from ..connection import connect
from ..errors import ConfigurationError, MailqError

HELP = """\
Copy Database Mail's configuration (msdb) into mailq-db: every account becomes
a sending account (mailq.UpsertSendingAccount: from address and display name;
an existing account of the same name is updated, its rate limits cleared and
its default flag dropped, so re-apply them afterwards or pass --no-accounts),
every profile a profile
with the same accounts in the same order, every principal grant and default
the same grant (public stays public; a msdb user or role is granted under the
same name here, and skipped with a warning if this database has no such
principal).  SMTP servers go to the worker configuration skeleton (--config-out);
passwords cannot be read from msdb: set the environment variables the
skeleton names (marked PLACEHOLDER) before starting the worker.  Accounts on
Microsoft 365, Outlook.com or Gmail, which take no passwords for SMTP, get a
commented OAuth 2.0 template to fill in instead (docs/oauth2.md).

The source's password is never taken from the command line: give the URL
without it and put the password in $MAILQ_DBMAIL_SOURCE_PASSWORD (or the
variable --source-password-env names), or the whole URL in
$MAILQ_DBMAIL_SOURCE_URL.  An existing --config-out file is kept unless
--force; --dry-run writes nothing.

examples:
  # the source's password in $MAILQ_DBMAIL_SOURCE_PASSWORD (from a vault or a file, never typed)
  mailq-db import-dbmail --source "mssql+pyodbc://sa@oldserver/msdb" --config-out worker.toml --dry-run
  mailq-db import-dbmail --source "mssql+pyodbc://sa@oldserver/msdb" --config-out worker.toml  # into $MAILQ_DB_URL
"""

SOURCE_URL_ENV = "MAILQ_DBMAIL_SOURCE_URL"
SOURCE_PASSWORD_ENV = "MAILQ_DBMAIL_SOURCE_PASSWORD"

PROFILES_SQL = (
    "SELECT p.profile_id, p.name, p.description FROM msdb.dbo.sysmail_profile AS p ORDER BY p.profile_id;"
)
ACCOUNTS_SQL = (
    "SELECT a.account_id, a.name, a.description, a.email_address, a.display_name, a.replyto_address "
    "FROM msdb.dbo.sysmail_account AS a ORDER BY a.account_id;"
)
SERVERS_SQL = (
    "SELECT s.account_id, s.servertype, s.servername, s.port, s.username, s.use_default_credentials, "
    "s.enable_ssl FROM msdb.dbo.sysmail_server AS s ORDER BY s.account_id;"
)
PROFILE_ACCOUNTS_SQL = (
    "SELECT pa.profile_id, pa.account_id, pa.sequence_number FROM msdb.dbo.sysmail_profileaccount AS pa "
    "ORDER BY pa.profile_id, pa.sequence_number, pa.account_id;"
)
# principal_sid 0x00 is the public principal; other sids are msdb users.
PRINCIPALS_SQL = (
    "SELECT pp.profile_id, CASE WHEN pp.principal_sid = 0x00 THEN N'public' ELSE dp.name END AS principal_name, "
    "pp.is_default FROM msdb.dbo.sysmail_principalprofile AS pp "
    "LEFT JOIN msdb.sys.database_principals AS dp ON dp.sid = pp.principal_sid "
    "ORDER BY pp.profile_id, principal_name;"
)

PLACEHOLDER = "PLACEHOLDER"


@dataclass
class Server:
    host: str
    port: int
    user: str | None
    use_default_credentials: bool
    enable_ssl: bool


@dataclass
class Account:
    account_id: int
    name: str
    description: str | None
    email_address: str
    display_name: str | None
    replyto_address: str | None
    server: Server | None = None


@dataclass
class Profile:
    profile_id: int
    name: str
    description: str | None
    accounts: list[tuple[int, str]] = field(default_factory=list)  # (sequence_number, account name)
    principals: list[tuple[str, bool]] = field(default_factory=list)  # (principal name, is_default)


@dataclass
class DbMailConfig:
    accounts: list[Account]
    profiles: list[Profile]
    warnings: list[str] = field(default_factory=list)


def _fetch(cursor: Any, sql: str) -> list[tuple]:
    cursor.execute(sql)
    return [tuple(row) for row in cursor.fetchall()]


def read_msdb(cursor: Any) -> DbMailConfig:
    """Read Database Mail's configuration with one cursor (read-only SELECTs)."""
    accounts = {
        int(r[0]): Account(int(r[0]), str(r[1]), r[2], str(r[3]), r[4] or None, r[5] or None)
        for r in _fetch(cursor, ACCOUNTS_SQL)
    }
    warnings: list[str] = []
    for account_id, servertype, host, port, user, default_credentials, ssl in _fetch(cursor, SERVERS_SQL):
        account = accounts.get(int(account_id))
        if account is None:
            continue
        if str(servertype).upper() != "SMTP":
            warnings.append(f"account {account.name}: server type {servertype} is not SMTP; skipped")
            continue
        account.server = Server(str(host), int(port or 25), user or None, bool(default_credentials), bool(ssl))
    profiles = {int(r[0]): Profile(int(r[0]), str(r[1]), r[2] or None) for r in _fetch(cursor, PROFILES_SQL)}
    for profile_id, account_id, sequence in _fetch(cursor, PROFILE_ACCOUNTS_SQL):
        profile, account = profiles.get(int(profile_id)), accounts.get(int(account_id))
        if profile and account:
            profile.accounts.append((int(sequence), account.name))
    for profile_id, principal, is_default in _fetch(cursor, PRINCIPALS_SQL):
        profile = profiles.get(int(profile_id))
        if profile is None:
            continue
        if principal is None:
            warnings.append(f"profile {profile.name}: a grant to a principal msdb no longer knows; skipped")
            continue
        profile.principals.append((str(principal), bool(is_default)))
    for account in accounts.values():
        if account.server and account.server.use_default_credentials:
            warnings.append(
                f"account {account.name}: msdb logs in with the SQL Server service's Windows credentials "
                "(use_default_credentials); the worker cannot: give it a user and password_env"
            )
        if account.replyto_address:
            warnings.append(
                f"account {account.name}: its reply-to address {account.replyto_address} is not an account "
                "setting here; pass @reply_to to mailq.SendDbMail"
            )
    return DbMailConfig(list(accounts.values()), list(profiles.values()), warnings)


def env_name(account_name: str) -> str:
    """The environment variable the skeleton names for an account's password."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", account_name).strip("_").upper() or "ACCOUNT"
    return f"MAILQ_SMTP_{slug}_PASSWORD"


def _toml(value: str) -> str:
    # A JSON string is a valid TOML basic string (same escapes, \\uXXXX included).
    return json.dumps(value, ensure_ascii=False)


#: SMTP submission hosts whose providers refuse (or will refuse) passwords: (pattern, kind)
OAUTH_HOSTS = (
    (re.compile(r"^(smtp|outlook)\.office365\.com$", re.IGNORECASE), "microsoft"),
    (re.compile(r"^smtp-mail\.outlook\.com$", re.IGNORECASE), "outlook.com"),
    (re.compile(r"^smtp\.(gmail|googlemail)\.com$", re.IGNORECASE), "google"),
)


def oauth_template(name: str, host: str, user: str | None) -> list[str] | None:
    """A commented OAuth 2.0 template for an account on Microsoft 365, Outlook.com or Gmail,
    whose providers take no passwords for SMTP (Exchange Online: 550 5.7.30 from the end of
    December 2026; Google Workspace since 30 September 2024), or None for other hosts."""
    kind = next((k for pattern, k in OAUTH_HOSTS if pattern.match(host or "")), None)
    if kind is None:
        return None
    consumer = kind == "google" and bool(re.search(r"@(gmail|googlemail)\.com$", user or "", re.IGNORECASE))
    table = f"[accounts.{_toml(name)}.oauth]"
    slug = env_name(name).rsplit("_PASSWORD", 1)[0]
    lines = [f"user = {_toml(user or PLACEHOLDER + '@example.invalid')}"]
    if kind == "microsoft":
        lines += [
            f"# {PLACEHOLDER}: Exchange Online refuses passwords for SMTP AUTH (550 5.7.30 Basic",
            "# authentication is not supported for Client Submission): this account signs in with",
            "# OAuth 2.0.  Register an application with the SMTP.SendAsApp permission and give its",
            "# service principal this mailbox (docs/oauth2.md, \"Microsoft 365\"), fill in the table",
            "# below and remove its leading \"# \".  --check-config refuses the account until then.",
            'auth = "xoauth2"',
            f"# {table}",
            '# provider = "microsoft"',
            '# tenant = "contoso.onmicrosoft.com"                   # Directory (tenant) ID or a verified domain',
            '# client_id = "00000000-0000-0000-0000-000000000000"  # Application (client) ID',
            f'# client_secret_env = "{slug}_CLIENT_SECRET"   # or certificate_file = "/etc/mailq/app.pem"',
        ]
    elif kind == "outlook.com" or consumer:
        issuer, tenant = ("microsoft", "consumers") if kind == "outlook.com" else ("google", None)
        lines += [
            f"# {PLACEHOLDER}: {'Outlook.com' if issuer == 'microsoft' else 'Gmail'} takes no password for SMTP from",
            "# this kind of mailbox: sign it in once interactively to get a refresh token",
            "# (docs/oauth2.md, \"Delegated mailboxes\"), fill in the table below and remove its",
            "# leading \"# \".  --check-config refuses the account until then.",
            'auth = "xoauth2"',
            f"# {table}",
            '# provider = "refresh_token"',
            f'# issuer = "{issuer}"',
            *([f'# tenant = "{tenant}"'] if tenant else []),
            '# client_id = "your OAuth client ID"',
            *([f'# client_secret_env = "{slug}_CLIENT_SECRET"'] if issuer == "google" else []),
            f'# refresh_token_file = "/etc/mailq/{slug.lower()}.refresh-token"',
        ]
    else:
        lines += [
            f"# {PLACEHOLDER}: Google Workspace takes no password for SMTP (since 30 September 2024):",
            "# this account signs in with OAuth 2.0 through a service account with domain-wide",
            "# delegation for the scope https://mail.google.com/ (docs/oauth2.md, \"Google Workspace\"),",
            "# fill in the table below and remove its leading \"# \".  --check-config refuses the",
            "# account until then.",
            'auth = "xoauth2"',
            f"# {table}",
            '# provider = "google"',
            '# service_account_file = "/etc/mailq/service-account.json"   # the JSON key',
            "# subject defaults to user: the mailbox the service account acts for",
        ]
    return lines


def worker_config_skeleton(config: DbMailConfig) -> str:
    """A worker.toml for the imported accounts, with marked password placeholders."""
    lines = [
        "# mailq-db worker configuration written by `mailq-db import-dbmail` from msdb's",
        "# Database Mail settings.  Check it with: mailq-db worker --config FILE --check-config",
        "#",
        f"# {PLACEHOLDER}: msdb never returns SMTP passwords.  Every password_env below",
        "# names an environment variable that you must set to the account's password",
        "# before starting the worker (--check-config says which ones are missing).",
        "",
        "[worker]",
        "batch_size = 50",
        "lease_seconds = 120",
        "",
    ]
    for account in config.accounts:
        lines.append(f"[accounts.{_toml(account.name)}]")
        if account.description:
            lines.append(f"# {' '.join(str(account.description).split())}")
        server = account.server
        if server is None:
            lines += [
                f"# {PLACEHOLDER}: msdb has no SMTP server for this account; fill in host and port.",
                f"host = {_toml(PLACEHOLDER + '.invalid')}",
                "",
            ]
            continue
        if server.enable_ssl and server.port == 465:
            tls = "implicit"
        elif server.enable_ssl:
            tls = "starttls"
        else:
            tls = "none"
        lines += [f"host = {_toml(server.host)}", f"port = {server.port}", f'tls = "{tls}"']
        if tls == "none":
            lines.append("allow_plaintext = true           # msdb had enable_ssl = 0: consider starttls")
        template = oauth_template(account.name, server.host, server.user or account.email_address)
        if template:
            lines += template
        elif server.use_default_credentials:
            lines.append(f"# {PLACEHOLDER}: msdb used Windows credentials; set user and password_env.")
        elif server.user:
            lines += [
                f"user = {_toml(server.user)}",
                f"password_env = {_toml(env_name(account.name))}   # {PLACEHOLDER}: set this variable",
            ]
        lines.append("")
    return "\n".join(lines)


@dataclass
class Step:
    text: str
    run: Callable[..., Any]


def plan_import(config: DbMailConfig, *, accounts: bool = True) -> list[Step]:
    """The procedure calls that recreate ``config`` here, in order, each with a description."""
    steps: list[Step] = []
    if accounts:
        for a in config.accounts:
            steps.append(Step(
                f"sending account {a.name} (from {a.email_address})",
                lambda conn, a=a: procedures.upsert_sending_account(
                    conn, account_name=a.name, default_from_address=a.email_address,
                    default_from_name=a.display_name),
            ))
    for p in config.profiles:
        steps.append(Step(
            f"profile {p.name}",
            lambda conn, p=p: procedures.upsert_db_mail_profile(conn, profile_name=p.name, description=p.description),
        ))
        for sequence, account_name in sorted(p.accounts):
            steps.append(Step(
                f"profile {p.name}: account {account_name} at {sequence}",
                lambda conn, p=p, s=sequence, n=account_name: procedures.upsert_db_mail_profile_account(
                    conn, profile_name=p.name, account_name=n, sequence_number=s),
            ))
        for principal, is_default in p.principals:
            steps.append(Step(
                f"profile {p.name}: granted to {principal}{' (default)' if is_default else ''}",
                lambda conn, p=p, n=principal, d=is_default: procedures.upsert_db_mail_principal_profile(
                    conn, profile_name=p.name, principal_name=n, is_default=d),
            ))
    return steps


def apply_steps(conn: Any, steps: Iterable[Step], out=sys.stdout) -> list[str]:
    """Run the steps; a principal missing here (50254) is a warning, every other error stops."""
    skipped = []
    for step in steps:
        try:
            step.run(conn)
        except MailqError as exc:
            if getattr(exc, "number", None) == 50254:
                skipped.append(f"{step.text}: skipped ({exc})")
                continue
            raise
        print(f"ok  {step.text}", file=out)
    return skipped


def register(subparsers) -> None:
    p = subparsers.add_parser("import-dbmail", help="copy Database Mail's accounts and profiles from msdb",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", help="URL (without password) of the server whose msdb holds Database Mail's "
                   f"settings (default: ${SOURCE_URL_ENV})")
    p.add_argument("--source-password-env", metavar="NAME", default=SOURCE_PASSWORD_ENV,
                   help=f"environment variable with the source's password (default {SOURCE_PASSWORD_ENV})")
    p.add_argument("--force", action="store_true", help="overwrite an existing --config-out file")
    p.add_argument("--db", help="mailq-db database URL (default: $MAILQ_DB_URL)")
    p.add_argument("--config-out", metavar="FILE", help="write the worker configuration skeleton here")
    p.add_argument("--no-accounts", action="store_true",
                   help="do not create or update sending accounts (they exist already)")
    p.add_argument("--dry-run", action="store_true", help="print what would be done; change nothing")
    p.set_defaults(func=run)


def source_url(args: argparse.Namespace, environ: dict[str, str] | None = None) -> str:
    """The source URL: --source (never with a password) or $MAILQ_DBMAIL_SOURCE_URL,
    with the password from the environment variable --source-password-env names."""
    env = os.environ if environ is None else environ
    url = args.source or env.get(SOURCE_URL_ENV)
    if not url:
        raise ConfigurationError(f"no source given: pass --source URL (without password) or set {SOURCE_URL_ENV}")
    parts = urlsplit(url)
    if args.source and parts.password:
        raise ConfigurationError("--source must not hold a password (it would show in the process list and the "
                                 f"shell history): put it in ${args.source_password_env} or the URL in "
                                 f"${SOURCE_URL_ENV}")
    password = env.get(args.source_password_env)
    if password and not parts.password and parts.username:
        host = parts.netloc.rpartition("@")[2]
        url = urlunsplit(parts._replace(netloc=f"{parts.username}:{quote(password, safe='')}@{host}"))
    return url


def read_source(url: str) -> DbMailConfig:
    """Database Mail's settings from the source; any failure is one line."""
    from ..procedures import _DRIVER_ERRORS

    try:
        source = connect(url)
        try:
            return read_msdb(source.cursor())
        finally:
            source.close()
    except _DRIVER_ERRORS as exc:
        detail = " ".join(str(exc.args[-1] if exc.args else exc).split())
        raise MailqError(f"cannot read Database Mail's settings from the source: {detail[:300]} (the login needs "
                         "SELECT on msdb's sysmail_* tables; Azure SQL Database has no msdb)") from None


def run(args: argparse.Namespace) -> int:
    if args.config_out and not args.dry_run and os.path.exists(args.config_out) and not args.force:
        raise ConfigurationError(f"{args.config_out} exists: pass --force to overwrite it, or another --config-out")
    config = read_source(source_url(args))
    steps = plan_import(config, accounts=not args.no_accounts)
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.dry_run:
        if args.config_out:
            print(f"would write {args.config_out}"
                  + (" (it exists: --force would be needed)" if os.path.exists(args.config_out) else ""))
        for step in steps:
            print(f"would: {step.text}")
        return 0
    if args.config_out:
        with open(args.config_out, "w" if args.force else "x", encoding="utf-8") as handle:
            handle.write(worker_config_skeleton(config))
        print(f"wrote {args.config_out} (fill in every {PLACEHOLDER}: password variables, OAuth 2.0 templates)")
    conn = connect(args.db)
    try:
        for line in apply_steps(conn, steps):
            print(f"warning: {line}", file=sys.stderr)
    finally:
        conn.close()
    return 0
