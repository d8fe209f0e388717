"""Issues 12 and 21 (and issue 11 point 10) against SQL Server: the rendered
script run by sqlcmd itself, without -b (and without ':on error exit', as a
client that ignores it runs it); re-run at head; a database newer than the
package; the downgrade's refusal to drop rows; options stored in the
database; the broker added later; drift after an ALTER by hand; activation
off while a revision changes the broker.

sqlcmd: go-sqlcmd or mssql-tools18 (``MAILQ_SQLCMD`` names the binary; CI
installs it).  Where the suite must run (``MAILQ_REQUIRE_INTEGRATION=1``), a
missing sqlcmd fails the test instead of skipping it.
"""

from __future__ import annotations

import io
import os
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
        # The baseline is one transaction: nothing of it is left.
        assert scalar(conn, f"SELECT OBJECT_ID(N'{V}')") is None
        assert scalar(conn, "SELECT SCHEMA_ID(N'mailq')") is None and scalar(conn, "SELECT SCHEMA_ID(N'delay')") is None
        assert user_queues(conn) == []


def test_a_database_newer_than_the_package_is_refused_and_left_alone(fresh_database, tmp_path):
    """Defect 8 of the 2026-11-26 reading: a database at a revision this
    package does not know gets 50421 ("a newer mailq-db deployed it"), not a
    command that cannot work; the script and the online path change nothing."""
    import contextlib
    import io as _io

    from mailq_db.cli import main

    url = fresh_database()
    with connection(url) as conn:
        execute(conn, f"UPDATE {V} SET version_num = '0099'")
        stamp = scalar(conn, "SELECT modify_date FROM sys.objects WHERE object_id = OBJECT_ID(N'mailq.ClaimMail')")
    result = run_sqlcmd(url, render("upgrade", "head"), tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and ("50421" in output or "a newer mailq-db deployed it" in output)
    err = _io.StringIO()
    with contextlib.redirect_stderr(err):
        os.environ["MAILQ_DB_URL"] = url
        try:
            assert main(["deploy"]) == 1
        finally:
            del os.environ["MAILQ_DB_URL"]
    assert "revision 0099, which this mailq-db does not know" in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM {V}") == "0099"
        assert scalar(conn, "SELECT modify_date FROM sys.objects "
                            "WHERE object_id = OBJECT_ID(N'mailq.ClaimMail')") == stamp


def test_script_refuses_master(mssql_server_url, tmp_path):
    result = run_sqlcmd(mssql_server_url, render("upgrade", "head"), tmp_path)
    assert result.returncode != 0
    assert "50412" in result.stdout + result.stderr or "system database" in result.stdout
    with connection(mssql_server_url) as conn:
        assert scalar(conn, f"SELECT OBJECT_ID(N'{V}')") is None
        assert scalar(conn, "SELECT SCHEMA_ID(N'mailq')") is None


def test_script_without_on_error_exit_still_stops_in_master(mssql_server_url, tmp_path):
    """A client that ignores ':on error exit' but honours ':setvar' (Azure Data
    Studio's SQLCMD mode) goes on after the 50412 THROW: the header guard after
    it sets NOEXEC ON, so not even the bookkeeping tables are created."""
    script = render("upgrade", "head")
    assert ":on error exit\n" in script
    result = run_sqlcmd(mssql_server_url, script.replace(":on error exit\n", ""), tmp_path)
    output = result.stdout + result.stderr
    assert "50412" in output or "system database" in output
    assert "the checks before the first revision stopped the deployment" in output
    with connection(mssql_server_url) as conn:
        for name in (V, d.OPTION_TABLE, d.FILE_TABLE):
            assert scalar(conn, f"SELECT OBJECT_ID(N'{name}')") is None, name
        assert scalar(conn, "SELECT SCHEMA_ID(N'mailq')") is None
        assert scalar(conn, "SELECT APPLOCK_MODE(N'public', N'mailq-db deploy', N'Session')") == "NoLock"


# -- issue 21 point 5: a downgrade never drops rows silently ---------------------------


def test_downgrade_script_refuses_while_tables_hold_rows(fresh_database, tmp_path):
    from mailq_helpers import enqueue, new_account, new_app

    url = fresh_database()
    with connection(url) as conn:
        enqueue(conn, new_account(conn, "dd"), new_app(conn, "dd"), 1)
    refused = run_sqlcmd(url, render("downgrade", "head:base"), tmp_path)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "50420" in output or "would drop tables that hold rows" in output
    assert "mailq.MailQueue (1 rows)" in output
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM {V}") == d.head_revision()
        assert scalar(conn, "SELECT COUNT(*) FROM mailq.MailQueue") == 1
        assert scalar(conn, "SELECT @@TRANCOUNT") == 0
    dropped = run_sqlcmd(url, render("downgrade", "head:base", "drop_data=yes"), tmp_path)
    assert dropped.returncode == 0, dropped.stdout[-3000:] + dropped.stderr[-3000:]
    with connection(url) as conn:
        assert scalar(conn, "SELECT SCHEMA_ID(N'mailq')") is None
        assert scalar(conn, f"SELECT COUNT(*) FROM {V}") == 0


# -- point 4: options stored, broker added later ------------------------------------


def test_upgrade_that_forgets_broker_off_keeps_it(fresh_database):
    url = fresh_database(deploy=False, broker=False)
    upgrade(url, "head", "broker=off")
    upgrade(url, "head")  # no -x broker=off: the stored option holds (nothing to do)
    with connection(url) as conn:
        assert scalar(conn, f"SELECT version_num FROM {V}") == d.head_revision()
        assert scalar(conn, f"SELECT Value FROM {d.OPTION_TABLE} WHERE Name = N'broker'") == "off"
        assert user_queues(conn) == [] and scalar(conn, "SELECT SCHEMA_ID(N'delay')") is None


def test_broker_added_later_without_downgrade(fresh_database, mssql_server_url):
    """A database deployed with -x broker=off gets delayed execution with
    -x broker=add: nothing is downgraded, the mail queue is not touched."""
    url = fresh_database(deploy=False, broker=False)
    upgrade(url, "head", "broker=off")
    name = urlsplit(url).path.lstrip("/")
    with connection(url) as conn:
        stamp = scalar(conn, "SELECT modify_date FROM sys.objects WHERE object_id = OBJECT_ID(N'mailq.ClaimMail')")
    with connection(mssql_server_url) as master:
        execute(master, f"ALTER DATABASE [{name}] SET ENABLE_BROKER WITH ROLLBACK IMMEDIATE")
    with pytest.raises(Exception, match="50414|broker=off"):
        upgrade(url, "head", "broker=on")  # stored off: an explicit on is refused
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


def test_activation_is_off_inside_a_broker_revision_and_restored(fresh_database):
    """The batches every revision with broker files wraps around them: the
    baseline creates the queue, so this runs them around a re-applied
    activation procedure on a deployed database, as a later revision would."""
    url = fresh_database()
    seen = []
    text = d.statement_text(d.frozen_text(d.head_revision(), "broker/dbo.ProcessDelayQueue.sql"))
    with connection(url) as conn:
        assert scalar(conn, "SELECT is_activation_enabled FROM sys.service_queues "
                            "WHERE name = N'DelayServiceQueue'") == 1
        for batch in (d.ACTIVATION_OFF, text, d.ACTIVATION_RESTORE):
            execute(conn, batch)
            if batch is text:
                seen.append(scalar(conn, "SELECT is_activation_enabled FROM sys.service_queues "
                                         "WHERE name = N'DelayServiceQueue'"))
        assert seen == [0]  # no reader can start while the revision runs
        assert scalar(conn, "SELECT is_activation_enabled FROM sys.service_queues "
                            "WHERE name = N'DelayServiceQueue'") == 1


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
