"""Issue 12 (and issue 11 point 10) against SQL Server: the rendered script run
by sqlcmd itself, without -b; re-run at head; the starting-revision check;
options stored in the database; the broker added later; drift after an ALTER
by hand; activation off while a revision changes the broker.

sqlcmd: go-sqlcmd or mssql-tools18 (``MAILQ_SQLCMD`` names the binary; CI
installs it).  Where the suite must run (``MAILQ_REQUIRE_INTEGRATION=1``), a
missing sqlcmd fails the test instead of skipping it.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from mailq_helpers import connection, execute, query, scalar
from mailq_db import deployment as d

pytestmark = pytest.mark.integration

V = f"{d.VERSION_SCHEMA}.{d.VERSION_TABLE}"


def sqlcmd_binary() -> str:
    for candidate in (os.environ.get("MAILQ_SQLCMD"), shutil.which("sqlcmd"),
                      "/opt/mssql-tools18/bin/sqlcmd", "/opt/mssql-tools/bin/sqlcmd"):
        if candidate and Path(candidate).is_file():
            return candidate
    if os.environ.get("MAILQ_REQUIRE_INTEGRATION") == "1":
        pytest.fail("sqlcmd is needed here: install go-sqlcmd or mssql-tools18 (or set MAILQ_SQLCMD)")
    pytest.skip("sqlcmd not installed (go-sqlcmd or mssql-tools18)")


def render(command: str, revision: str, *x_args: str) -> str:
    from alembic import command as alembic_command

    out = io.StringIO()
    cfg = d.alembic_config(x_args=list(x_args), stdout=out)
    getattr(alembic_command, command)(cfg, revision, sql=True)
    return out.getvalue()


def run_sqlcmd(url: str, script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """The script through sqlcmd WITHOUT -b (and without -I): the script must
    stop at the first error and set its own options."""
    parts = urlsplit(url)
    path = tmp_path / "script.sql"
    path.write_text(script, encoding="utf-8")
    args = [sqlcmd_binary(), "-S", f"{parts.hostname},{parts.port}", "-U", unquote(parts.username),
            "-d", parts.path.lstrip("/"), "-C", "-i", str(path)]
    env = dict(os.environ, SQLCMDPASSWORD=unquote(parts.password or ""))
    return subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)


def upgrade(url: str, revision: str = "head", *x_args: str) -> None:
    from alembic import command

    command.upgrade(d.alembic_config(x_args=[f"url={url}", *x_args]), revision)


def user_queues(conn) -> list[tuple]:
    return query(conn, "SELECT name FROM sys.service_queues WHERE is_ms_shipped = 0")


# -- points 1 and 2: sqlcmd without -b ----------------------------------------------


def test_script_through_sqlcmd_deploys_and_a_rerun_changes_nothing(fresh_database, tmp_path):
    url = fresh_database(deploy=False)
    script = render("upgrade", "head")
    first = run_sqlcmd(url, script, tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM {V}") == d.head_revision()
        stamp = scalar(conn, "SELECT modify_date FROM sys.objects WHERE object_id = OBJECT_ID(N'mailq.ClaimMail')")
        files = scalar(conn, f"SELECT COUNT(*) FROM {d.FILE_TABLE}")
        assert files > 0
        assert scalar(conn, f"SELECT Value FROM {d.OPTION_TABLE} WHERE Name = N'broker'") == "on"
    again = run_sqlcmd(url, script, tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "nothing to do" in again.stdout
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM {V}") == d.head_revision()
        assert scalar(conn, "SELECT modify_date FROM sys.objects "
                            "WHERE object_id = OBJECT_ID(N'mailq.ClaimMail')") == stamp
        assert scalar(conn, f"SELECT COUNT(*) FROM {d.FILE_TABLE}") == files
        assert scalar(conn, "SELECT @@TRANCOUNT") == 0


def test_sqlcmd_without_b_stops_when_the_broker_is_disabled(fresh_database, tmp_path):
    """Before issue 12 the broker batches failed one by one and the script went
    on to stamp the database at head."""
    url = fresh_database(deploy=False, broker=False)
    result = run_sqlcmd(url, render("upgrade", "head"), tmp_path)
    assert result.returncode != 0
    assert "50401" in result.stdout + result.stderr or "Service Broker is not enabled" in result.stdout
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM {V}") == "0001"  # 0001 committed, 0002 rolled back
        assert scalar(conn, "SELECT SCHEMA_ID(N'delay')") is None
        assert user_queues(conn) == []


def test_partial_script_refuses_a_database_at_another_revision(fresh_database, tmp_path):
    url = fresh_database(deploy=False)
    upgrade(url, "0001")
    result = run_sqlcmd(url, render("upgrade", "0002:head"), tmp_path)  # starts with 0003, needs 0002
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "50410" in output or "Revision 0003 upgrades a database at 0002" in output
    assert "mailq-db deploy --sql --revision 0001:head" in output
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM {V}") == "0001"
        assert scalar(conn, "SELECT OBJECT_ID(N'delay.Task')") is None


def test_script_refuses_master(mssql_server_url, tmp_path):
    result = run_sqlcmd(mssql_server_url, render("upgrade", "head"), tmp_path)
    assert result.returncode != 0
    assert "50412" in result.stdout + result.stderr or "system database" in result.stdout
    with connection(mssql_server_url) as conn:
        assert scalar(conn, f"SELECT OBJECT_ID(N'{V}')") is None
        assert scalar(conn, "SELECT SCHEMA_ID(N'mailq')") is None


# -- point 4: options stored, broker added later ------------------------------------


def test_upgrade_that_forgets_broker_off_keeps_it(fresh_database):
    url = fresh_database(deploy=False, broker=False)
    upgrade(url, "0002", "broker=off")
    upgrade(url, "head")  # no -x broker=off: the stored option holds
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM {V}") == d.head_revision()
        assert scalar(conn, f"SELECT Value FROM {d.OPTION_TABLE} WHERE Name = N'broker'") == "off"
        assert user_queues(conn) == [] and scalar(conn, "SELECT SCHEMA_ID(N'delay')") is None


def test_broker_added_later_to_a_legacy_database_without_downgrade(fresh_database, mssql_server_url):
    """A database at head deployed by the old -x broker=off (no stored options)
    gets delayed execution with -x broker=add: nothing is downgraded."""
    url = fresh_database(deploy=False, broker=False)
    upgrade(url, "head", "broker=off")
    name = urlsplit(url).path.lstrip("/")
    with connection(url) as conn:
        execute(conn, f"DROP TABLE {d.OPTION_TABLE}")  # as before issue 12
        stamp = scalar(conn, "SELECT modify_date FROM sys.objects WHERE object_id = OBJECT_ID(N'mailq.ClaimMail')")
    with connection(mssql_server_url) as master:
        execute(master, f"ALTER DATABASE [{name}] SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE")
    with pytest.raises(Exception, match="50414|broker=off"):
        upgrade(url, "head", "broker=on")  # inferred off: an explicit on is refused
    upgrade(url, "head", "broker=add")
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM {V}") == d.head_revision()
        assert scalar(conn, f"SELECT Value FROM {d.OPTION_TABLE} WHERE Name = N'broker'") == "on"
        assert user_queues(conn) == [("DelayServiceQueue",)]
        assert scalar(conn, "SELECT is_activation_enabled FROM sys.service_queues "
                            "WHERE name = N'DelayServiceQueue'") == 1
        assert scalar(conn, "SELECT modify_date FROM sys.objects "
                            "WHERE object_id = OBJECT_ID(N'mailq.ClaimMail')") == stamp
        definition = scalar(conn, "SELECT OBJECT_DEFINITION(OBJECT_ID(N'dbo.ProcessDelayQueue'))")
        newest = d.newest_frozen("broker/dbo.ProcessDelayQueue.sql", before="9999")
        assert d.normalise_module(definition) == d.normalise_module(
            d.frozen_text(newest, "broker/dbo.ProcessDelayQueue.sql"))
    upgrade(url, "head")  # afterwards an ordinary upgrade works


# -- point 5: drift -----------------------------------------------------------------


def test_doctor_reports_a_procedure_altered_by_hand(fresh_database):
    from mailq_db.commands.doctor import drift_checks
    from mailq_db.connection import connect

    url = fresh_database()
    assert [c.status for c in drift_checks(connect(url))] == ["OK"]
    with connection(url) as conn:
        definition = scalar(conn, "SELECT OBJECT_DEFINITION(OBJECT_ID(N'mailq.CancelMail'))")
        execute(conn, definition.replace("SET NOCOUNT", "-- hotfix\n    SET NOCOUNT", 1))
    checks = drift_checks(connect(url))
    assert [(c.name, c.status) for c in checks] == [("Drift mailq.CancelMail", "FAIL")]


# -- issue 11 point 10: activation off while a revision changes the broker ----------


def batches_of(script: str) -> list[str]:
    body = "\n".join(ln for ln in script.splitlines() if not ln.startswith(":"))
    return [b.strip() for b in re.split(r"^\s*GO\s*$", body, flags=re.M) if b.strip()]


def test_activation_is_off_inside_a_broker_revision_and_restored(fresh_database):
    url = fresh_database(deploy=False)
    upgrade(url, "0003")
    script = render("upgrade", "0003:0004")
    seen = []
    with connection(url) as conn:
        assert scalar(conn, "SELECT is_activation_enabled FROM sys.service_queues "
                            "WHERE name = N'DelayServiceQueue'") == 1
        for batch in batches_of(script):
            if batch.startswith("IF N'$(__IsSqlCmdEnabled)'"):
                continue
            execute(conn, batch)
            if "CREATE OR ALTER PROCEDURE dbo.ProcessDelayQueue" in batch:
                seen.append(scalar(conn, "SELECT is_activation_enabled FROM sys.service_queues "
                                         "WHERE name = N'DelayServiceQueue'"))
        assert seen == [0]  # no reader can start while the revision runs
        assert scalar(conn, "SELECT is_activation_enabled FROM sys.service_queues "
                            "WHERE name = N'DelayServiceQueue'") == 1
        assert scalar(conn, f"SELECT version_num FROM {V}") == "0004"


# -- point 7: two deployers ---------------------------------------------------------


def test_a_second_deployer_stops_on_the_application_lock(fresh_database):
    url = fresh_database()
    with connection(url) as holder:
        execute(holder, "DECLARE @r INT; EXEC @r = sys.sp_getapplock @Resource = N'mailq-db deploy', "
                        "@LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = 0;")
        with pytest.raises(Exception, match="50416|Another mailq-db deployment"):
            upgrade(url, "head", "lock_timeout=1000")
        execute(holder, "EXEC sys.sp_releaseapplock @Resource = N'mailq-db deploy', @LockOwner = N'Session';")
    upgrade(url, "head")  # free again: the deployment runs (a no-op at head)


# -- point 3: a version table an older mailq-db left in the deployer's schema -------


def test_version_table_in_another_schema_is_not_deployed_over(fresh_database):
    url = fresh_database(deploy=False)
    with connection(url) as conn:
        execute(conn, "EXEC (N'CREATE SCHEMA deployer')")
        execute(conn, "CREATE TABLE deployer.mailq_alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        execute(conn, "INSERT INTO deployer.mailq_alembic_version (version_num) VALUES ('0004')")
    with pytest.raises(Exception, match="50417|ALTER SCHEMA dbo TRANSFER"):
        upgrade(url)
    with connection(url) as conn:
        assert scalar(conn, "SELECT SCHEMA_ID(N'mailq')") is None
        assert scalar(conn, f"SELECT OBJECT_ID(N'{V}')") is None
