"""``mailq-db doctor``: check an installation and say how to fix each problem."""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass
from typing import Any

from .. import connection, procedures
from ..connection import connect
from ..errors import DatabaseError, MailqError

HELP = """\
Check everything the mail queue needs, from this machine to the database:
the ODBC driver, connectivity, server version and edition, compatibility level
(130 or more), schema revision against this package's head, Service Broker and
its queue, the current login's roles and permissions, stuck leases and pending
failures, and whether an open transaction holds the event stream and the
hooks back (mailq.GetEventStreamStall). Each problem is printed with its fix.

Exit status: 0 when every check is OK (warnings allowed unless --strict),
1 when a check failed.

examples:
  mailq-db doctor
  mailq-db doctor --db "mssql+pyodbc://sql1/mail?driver=ODBC+Driver+18+for+SQL+Server"   (integrated login)
  mailq-db doctor --strict      # warnings count as problems too (for monitoring)
"""

STATUSES = ("OK", "WARN", "FAIL")
NOT_DEPLOYED = 2812  # Could not find stored procedure
#: A writing transaction open this long that holds the event stream back is reported.
STALL_SECONDS = 60
#: Without the permission to see transactions: seconds between two samples of
#: MIN_ACTIVE_ROWVERSION(); the same value held back in both is one transaction.
STALL_RESAMPLE_SECONDS = 3.0


@dataclass
class Check:
    area: str
    name: str
    status: str
    detail: str
    fix: str | None = None


def register(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="check driver, server, schema, broker, roles",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", help="database URL (default: $MAILQ_DB_URL)")
    p.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    p.set_defaults(func=run)


def local_checks() -> list[Check]:
    checks = [Check("Client", "Python", "OK", platform.python_version())]
    problem = connection.pyodbc_problem()
    if problem:
        checks.append(Check("Client", "pyodbc", "FAIL", f"pyodbc cannot load: {problem}",
                            "Debian/Ubuntu: apt-get install unixodbc (pyodbc needs libodbc.so.2)"))
    drivers = connection.installed_drivers()
    try:
        chosen = connection.find_driver(drivers)
        checks.append(Check("Client", "ODBC driver", "OK",
                            f"{chosen} (registered: {', '.join(drivers)})"))
    except MailqError as exc:
        text = str(exc)
        checks.append(Check("Client", "ODBC driver", "FAIL", text.splitlines()[0],
                            "\n".join(text.splitlines()[1:])))
    return checks


def head_check(rows: list[dict[str, Any]]) -> Check:
    """Compare the schema revision the server reports with this package's head."""
    try:
        from ..deployment import head_revision

        head = head_revision()
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        return Check("Schema", "Revision vs package head", "WARN",
                     f"cannot read this package's head revision ({type(exc).__name__}: {exc})",
                     "reinstall mailq-db (the wheel carries alembic/)")
    if not head:
        return Check("Schema", "Revision vs package head", "WARN", "this package carries no revision",
                     "reinstall mailq-db")
    deployed = next((r for r in rows if "revision" in str(r.get("CheckName", "")).lower()), None)
    if deployed is None:
        return Check("Schema", "Revision vs package head", "WARN",
                     f"the server reported no schema revision; package head is {head}",
                     "run mailq-db deploy")
    detail = str(deployed.get("Detail") or "")
    if head and head in detail:
        return Check("Schema", "Revision vs package head", "OK", f"at head {head}")
    from ..deployment import revisions

    if detail.strip() and detail.strip() not in revisions():
        return Check("Schema", "Revision vs package head", "FAIL",
                     f"server: {detail}, a revision this mailq-db does not know (its head: {head})",
                     "a newer mailq-db deployed it: use that version or a later one (error 50421)")
    return Check("Schema", "Revision vs package head", "FAIL",
                 f"server: {detail or 'unknown'}; package head: {head}",
                 "run mailq-db deploy (or deploy --sql and hand the script to the DBA)")


def server_checks(url: str | None) -> list[Check]:
    try:
        conn = connect(url, timeout=10, query_timeout=30)
    except MailqError as exc:
        return [Check("Server", "Connectivity", "FAIL", str(exc).splitlines()[0],
                      "check MAILQ_DB_URL/--db (host, port, database, user), the firewall, "
                      "and that the server accepts SQL logins")]
    checks = [Check("Server", "Connectivity", "OK", "connected")]
    try:
        rows = procedures.get_installation_health(conn)
        delay = delay_checks(conn)  # owner login, TRUSTWORTHY, chaining, delay.Monitor (report only)
        delay += bounce_checks(conn)  # suppression list, bounce and complaint rates
        delay += enqueue_policy_checks(conn)
        stall = stall_checks(conn)
    except DatabaseError as exc:
        if exc.number == NOT_DEPLOYED:
            return checks + [Check("Schema", "Deployed", "FAIL", "schema not deployed (mailq.GetInstallationHealth "
                                   "does not exist)", "run mailq-db deploy")]
        return checks + [Check("Schema", "GetInstallationHealth", "FAIL", str(exc),
                               "the login needs EXECUTE on schema mailq (role MailqAdmin or MailqSender)")]
    finally:
        conn.close()
    try:
        drift_rows = drift_checks(connect(url, timeout=10, query_timeout=60))
    except MailqError as exc:
        drift_rows = [Check("Schema", "Drift", "WARN", f"cannot compare with the frozen SQL: {exc}")]
    for r in rows:
        status = str(r.get("Status") or "WARN").upper()
        checks.append(Check(str(r.get("Area") or "Server"), str(r.get("CheckName") or "?"),
                            status if status in STATUSES else "WARN",
                            str(r.get("Detail") or ""), r.get("Fix")))
    checks += delay
    checks += stall
    checks.append(head_check(rows))
    return checks + drift_rows


def drift_report(deployed: str | None, broker: bool, definitions: dict[str, str | None],
                 stored: dict[tuple[str, str], str] | None = None) -> list[Check]:
    """Drift of the database against this package's frozen SQL (what Flyway's
    validate and SSDT's drift report give): every module compared with the
    frozen text of the revision the database is at, object by object, and the
    checksums each revision stored compared with the package's frozen files."""
    from .. import deployment as dep

    if not deployed:
        return [Check("Schema", "Drift", "WARN", "no revision recorded: nothing to compare",
                      "run mailq-db deploy")]
    expected = dep.expected_modules(deployed, broker)
    problems = dep.drift(expected, definitions)
    checks = [Check("Schema", f"Drift {line.split(':', 1)[0]}", "FAIL", line.split(": ", 1)[1],
                    "compare with `mailq-db deploy --sql`; ALTERs by hand are lost at the next "
                    "deployment and hide from review") for line in problems]
    for (rev, rel), digest in sorted((stored or {}).items()):
        try:
            here = dep.text_sha256(dep.frozen_text(rev, rel))
        except OSError:
            here = None
        if here != digest:
            checks.append(Check("Schema", f"Checksum {rev}/{rel}", "WARN",
                                "the package's frozen copy differs from what revision "
                                f"{rev} applied", "install the package version that deployed it"))
    if not checks:
        checks.append(Check("Schema", "Drift", "OK",
                            f"{len(expected)} modules equal the frozen SQL of revision {deployed}"))
    return checks


def drift_checks(conn) -> list[Check]:
    """Read what drift_report needs from the database, then report."""
    from .. import deployment as dep

    try:
        cur = conn.cursor()
        cur.execute(f"SELECT MAX(version_num) FROM {dep.VERSION_SCHEMA}.{dep.VERSION_TABLE}")
        deployed = cur.fetchone()[0]
        cur.execute(f"SELECT OBJECT_ID(N'{dep.OPTION_TABLE}', N'U'), OBJECT_ID(N'{dep.FILE_TABLE}', N'U')")
        has_options, has_files = cur.fetchone()
        broker = True
        if has_options is not None:
            cur.execute(f"SELECT Value FROM {dep.OPTION_TABLE} WHERE Name = N'broker'")
            row = cur.fetchone()
            broker = row is None or row[0] == "on"
        stored = {}
        if has_files is not None:
            cur.execute(f"SELECT Revision, FilePath, Sha256 FROM {dep.FILE_TABLE}")
            stored = {(r[0], r[1]): r[2] for r in cur.fetchall()}
        definitions: dict[str, str | None] = {}
        unreadable = 0
        expected = dep.expected_modules(deployed, broker) if deployed else {}
        if deployed:
            for name in expected:
                cur.execute("SELECT OBJECT_ID(?), OBJECT_DEFINITION(OBJECT_ID(?))", name, name)
                object_id, definition = cur.fetchone()
                if object_id is not None and definition is None:
                    unreadable += 1  # exists, but this login may not read its text
                    definitions[name] = expected[name][2]
                else:
                    definitions[name] = definition
        if unreadable:
            return [Check("Schema", "Drift", "OK", f"not compared: this login cannot read {unreadable} "
                          "module definitions (run mailq-db doctor as db_owner, or GRANT VIEW DEFINITION)")]
        return drift_report(deployed, broker, definitions, stored)
    except Exception as exc:  # noqa: BLE001 - a login without rights on dbo's tables
        return [Check("Schema", "Drift", "OK", "not compared: this login cannot read the deployment's "
                      f"bookkeeping ({type(exc).__name__}); run mailq-db doctor as db_owner")]
    finally:
        conn.close()


#: One row about the database: the owner's login (activation runs EXECUTE AS
#: OWNER, which fails, and no delayed task runs, after a restore to a server
#: without that login), TRUSTWORTHY, the database's cross-database ownership
#: chaining, and the server's 'cross db ownership chaining' option.
DATABASE_SQL = (
    "SELECT SUSER_SNAME(d.owner_sid) AS OwnerLogin, d.is_trustworthy_on, d.is_db_chaining_on, "
    "(SELECT CAST(c.value_in_use AS INT) FROM sys.configurations AS c WHERE c.name = N'cross db ownership chaining') "
    "FROM sys.databases AS d WHERE d.database_id = DB_ID();"
)


def database_checks(row: Any) -> list[Check]:
    """The owner's login, TRUSTWORTHY and cross-database ownership chaining: delayed
    targets and hooks run as MailqRunner inside the database; TRUSTWORTHY (with a
    powerful owner) or chaining would let that context reach beyond it."""
    owner, trustworthy, db_chaining, server_chaining = (tuple(row) + (None,) * 4)[:4] if row else (None,) * 4
    checks = [Check("Broker", "Database owner login", "OK", f"owner login {owner} exists") if owner else Check(
        "Broker", "Database owner login", "FAIL",
        "the database owner's SID maps to no login on this server (restored from another server?); "
        "activation runs EXECUTE AS OWNER and fails, so no delayed task runs",
        "ALTER AUTHORIZATION ON DATABASE::[YourDb] TO [an existing login]; (a DBA decision: that login owns dbo)")]
    checks.append(Check("Security", "TRUSTWORTHY", "WARN" if trustworthy else "OK",
                        "ON: an impersonated context (MailqRunner, activation's dbo) is trusted beyond this "
                        "database" if trustworthy else "OFF",
                        "ALTER DATABASE [YourDb] SET TRUSTWORTHY OFF; (use module signing for what needed it)"))
    chaining = [name for name, on in (("database", db_chaining), ("server", server_chaining)) if on]
    checks.append(Check("Security", "Cross-database ownership chaining", "WARN" if chaining else "OK",
                        f"ON ({', '.join(chaining)}): a dbo-owned target or hook reaches other databases' "
                        "dbo-owned objects unchecked" if chaining else "OFF",
                        "ALTER DATABASE [YourDb] SET DB_CHAINING OFF; / EXEC sp_configure 'cross db ownership "
                        "chaining', 0; RECONFIGURE;"))
    return checks


def delay_checks(conn: Any) -> list[Check]:
    """Delayed execution: the database facts above, then delay.Monitor (report only):
    a Critical finding fails, a Warning warns, each with its fix."""
    cursor = conn.cursor()
    try:
        cursor.execute(DATABASE_SQL)
        row = cursor.fetchone()
    finally:
        cursor.close()
    checks = database_checks(row)
    try:
        findings = procedures.monitor_delayed_execution(conn, apply=False, raise_on_critical=False)
    except DatabaseError as exc:
        if exc.number == NOT_DEPLOYED:
            return checks  # delayed execution not deployed (-x broker=off)
        checks.append(Check("Broker", "delay.Monitor", "WARN", str(exc).splitlines()[0],
                            "run as MailqAdmin or db_owner (docs/delayed-execution.md, Operating)"))
        return checks
    for f in findings:
        checks.append(Check("Broker", str(f.get("Finding")), "FAIL" if f.get("Severity") == "Critical" else "WARN",
                            str(f.get("Detail") or ""), f.get("Fix")))
    if not findings:
        checks.append(Check("Broker", "delay.Monitor", "OK", "delayed execution runs its tasks"))
    return checks


def bounce_checks(conn: Any) -> list[Check]:
    """Suppressions and bounce/complaint rates (mailq_db.bounces.health); none before they are deployed."""
    from ..bounces import health

    get = getattr(procedures, "get_suppression_stats", None)  # a stand-in without it: no check
    if get is None:
        return []
    try:
        stats = get(conn, days=7)
    except DatabaseError as exc:
        if exc.number == NOT_DEPLOYED:
            return []
        return [Check("Bounces", "GetSuppressionStats", "WARN", str(exc).splitlines()[0],
                      "run as MailqAdmin (EXECUTE on mailq.GetSuppressionStats)")]
    return [Check(*f) for f in health.findings(stats, 7)]


def enqueue_policy_checks(conn: Any) -> list[Check]:
    """Who may send as whom (docs/enqueue.md): the enqueue policy in force and
    the database users that may enqueue without being mapped to an application."""
    try:
        policy = procedures.get_enqueue_policy(conn)
    except DatabaseError as exc:
        if exc.number == NOT_DEPLOYED:
            return []
        return [Check("Security", "Enqueue policy", "WARN", str(exc).splitlines()[0],
                      "run mailq-db doctor as a MailqAdmin member (EXECUTE on mailq.GetEnqueuePolicy)")]
    bind = "EXEC mailq.BindApplication @AppName = N'<application>', @PrincipalName = N'{}';"
    if policy.allow_unmapped_enqueuers:
        mode = Check("Security", "Enqueue policy", "OK",
                     f"open: unmapped users enqueue unbound, through any account as any From address "
                     f"(opted in by {policy.changed_by or '?'} at {policy.changed_at_utc} UTC)",
                     "EXEC mailq.SetEnqueuePolicy @AllowUnmappedEnqueuers = 0;  (after mapping every user)")
    else:
        mode = Check("Security", "Enqueue policy", "OK", "closed: users mapped to no application are refused (50500)")
    if not policy.membership_visible:
        users = Check("Security", "Unmapped enqueuers", "WARN",
                      "this login may not see other users' role memberships and grants, so the list is unknown",
                      "run mailq-db doctor as db_owner, or GRANT VIEW DEFINITION TO [this user];")
    elif not policy.unmapped:
        users = Check("Security", "Unmapped enqueuers", "OK", "every user that may enqueue is mapped to an application")
    else:
        names = sorted({name for name, _ in policy.unmapped})
        via = ", ".join(f"{name} (via {v})" for name, v in policy.unmapped[:5])
        effect = "enqueue unbound" if policy.allow_unmapped_enqueuers else "are refused (50500)"
        users = Check("Security", "Unmapped enqueuers", "WARN",
                      f"{len(names)} user(s) may call an enqueue procedure, mapped to no application, and "
                      f"{effect}: {via}{' ...' if len(policy.unmapped) > 5 else ''}",
                      "\n".join(bind.format(n.replace("'", "''")) for n in names[:5]))
    if policy.allow_unmapped_enqueuers and users.status != "OK":
        mode.status = "WARN"
    return [mode, users]
STALL_FIX = (
    "end that transaction: commit or roll back in the application that opened it (a session left idle "
    "in an open transaction is the usual cause); KILL <session> as a last resort; an in-doubt MSDTC "
    "transaction is resolved in MSDTC (or KILL '<unit of work>'). See docs/events.md, \"When the stream stalls\"."
)


def stall_checks(conn: Any, *, sleep=time.sleep) -> list[Check]:
    """The event stream and the hook dispatcher read only below
    MIN_ACTIVE_ROWVERSION(): an open transaction that wrote a rowversion value
    anywhere in the database holds them back.  Report it when it lasts."""
    name = "Event stream held back"
    try:
        stall = procedures.get_event_stream_stall(conn, min_open_seconds=STALL_SECONDS)
    except DatabaseError as exc:
        if exc.number == NOT_DEPLOYED:
            return []
        return [Check("Events", name, "WARN", f"cannot check: {str(exc).splitlines()[0]}",
                      "run doctor as a member of MailqAdmin (EXECUTE on mailq.GetEventStreamStall)")]
    if not stall.held_back:
        return [Check("Events", name, "OK", "no open transaction holds the event stream or the hooks back")]
    if stall.can_see_transactions:
        if not stall.holders:
            return [Check("Events", name, "OK", f"a write in flight; no writing transaction open "
                          f"{STALL_SECONDS} s or more")]
        oldest = stall.holders[0]
        more = f" (and {len(stall.holders) - 1} more)" if len(stall.holders) > 1 else ""
        return [Check("Events", name, "WARN",
                      f"events and hooks wait for {oldest.describe()}{more}", STALL_FIX)]
    sleep(STALL_RESAMPLE_SECONDS)
    again = procedures.get_event_stream_stall(conn, min_open_seconds=STALL_SECONDS)
    if again.held_back and again.min_active_rowversion == stall.min_active_rowversion:
        return [Check("Events", name, "WARN",
                      f"one open transaction has held events and hooks back for {STALL_RESAMPLE_SECONDS:g} s "
                      f"or more; this login cannot see which (it needs {stall.permission})",
                      f"GRANT {stall.permission.split(' (')[0]} to the login running doctor, run it again, "
                      "then " + STALL_FIX)]
    return [Check("Events", name, "OK", "held back only by writes in flight")]


def render(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"[{c.status:<4}] {c.area} / {c.name}: {c.detail}")
        if c.status != "OK" and c.fix:
            lines += [f"       fix: {line}" for line in str(c.fix).splitlines() if line.strip()]
    failed = sum(c.status == "FAIL" for c in checks)
    warned = sum(c.status == "WARN" for c in checks)
    lines.append(f"{len(checks)} checks: {failed} failed, {warned} warnings")
    return "\n".join(lines)


def run(args) -> int:
    checks = local_checks()
    if not any(c.status == "FAIL" for c in checks):
        try:
            url = connection.resolve_url(args.db)
        except MailqError as exc:
            checks.append(Check("Server", "Connectivity", "FAIL", str(exc),
                                "set MAILQ_DB_URL (mssql+pyodbc://user:password@host:port/database; keep a password out of --db)"))
        else:
            checks += server_checks(url)
    print(render(checks))
    bad = {"FAIL", "WARN"} if args.strict else {"FAIL"}
    return 1 if any(c.status in bad for c in checks) else 0
