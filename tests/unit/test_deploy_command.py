"""Issue 12 points 6 and 7: connection strings, and an online deploy that fails
on one line (revision, file, server message) instead of a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mailq_db import deployment as d
from mailq_db.commands.deploy import describe_failure
from mailq_db.connection import to_odbc

# -- 6. connection strings ----------------------------------------------------


def test_azure_ad_authentication_gets_no_trusted_connection():
    odbc = to_odbc("mssql+pyodbc://sql1.database.windows.net/mail?Authentication=ActiveDirectoryMsi",
                   driver="ODBC Driver 18 for SQL Server")
    assert "Authentication=ActiveDirectoryMsi" in odbc
    assert "Trusted_Connection" not in odbc  # ODBC refuses the pair (FA001)


def test_lower_case_authentication_key_counts_too():
    odbc = to_odbc("mssql+pyodbc://sql1/mail?authentication=ActiveDirectoryDefault", driver="x")
    assert "Trusted_Connection" not in odbc


def test_integrated_login_without_user_still_gets_trusted_connection():
    assert "Trusted_Connection=yes" in to_odbc("mssql+pyodbc://sql1/mail", driver="x")


@pytest.mark.parametrize("url", ["mssql+pyodbc://mailer@sql1/mail", "mssql+pyodbc://mailer:@sql1/mail"])
def test_empty_password_is_not_sent(url):
    odbc = to_odbc(url, driver="x")
    assert "UID=mailer" in odbc and "PWD" not in odbc


def test_password_is_kept_and_quoted():
    assert "PWD={p;w}" in to_odbc("mssql+pyodbc://u:p%3Bw@sql1/mail", driver="x")


# -- 7. one-line failures -------------------------------------------------------


class FakePyodbcError(Exception):
    pass


FakePyodbcError.__module__ = "pyodbc"


def test_failure_names_revision_file_and_server_message(monkeypatch):
    monkeypatch.setitem(d.PROGRESS, "revision", "0003")
    monkeypatch.setitem(d.PROGRESS, "file", "procedures/mailq.ClaimMail.sql")
    err = FakePyodbcError("42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"
                          "Invalid column name 'Nope'. (207) (SQLExecDirectW)")
    wrapped = RuntimeError("wrapped")
    wrapped.orig = err
    line = describe_failure(wrapped)
    assert line == ("mailq-db deploy: failed in revision 0003, file procedures/mailq.ClaimMail.sql: "
                    "Invalid column name 'Nope'. (207)")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "MAILQ_DB_URL"}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "mailq_db.cli", *args], capture_output=True, text=True,
                          timeout=120, env=full)


def test_unreachable_server_is_one_line_not_a_traceback():
    result = run_cli("deploy", env={"MAILQ_DB_URL": "mssql+pyodbc://u:pw@127.0.0.1:1/db?driver=FreeTDS"})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mailq-db deploy: failed") and "Traceback" not in result.stderr


def test_deploy_without_url_says_to_set_the_environment_variable():
    result = run_cli("deploy")
    assert result.returncode == 1
    assert "MAILQ_DB_URL" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_typo_in_an_option_is_refused_and_nothing_is_printed():
    result = run_cli("deploy", "--sql", "-x", "brokr=off")
    assert result.returncode == 1 and result.stdout == ""
    assert "did you mean broker?" in result.stderr


# -- 7. the failing batch's place in its file ------------------------------------
# A fake DB-API connection that raises on a chosen batch: this tests the deploy
# tool's bookkeeping and formatting, not any procedure (no SQL Server runs here).


class FakeCursor:
    def __init__(self, fail_when: str, message: str):
        self.fail_when, self.message, self.sent = fail_when, message, []

    def execute(self, sql: str) -> None:
        self.sent.append(sql)
        if self.fail_when in sql:
            raise FakePyodbcError("42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"
                                  f"{self.message} (SQLExecDirectW)")


def run_plan_until_failure(revision: str, rel: str, message: str) -> tuple[str, FakeCursor]:
    text = d.frozen_text(revision, rel, d.project_root())
    marker = d.statement_text(text).splitlines()[-1]  # the last line sent: in no header batch
    cursor = FakeCursor(marker, message)
    plan = d.RevisionPlan(revision, d.project_root(), execute=cursor.execute)
    d.reset_progress()
    with pytest.raises(FakePyodbcError) as info:
        plan.upgrade()
    return describe_failure(info.value), cursor


def test_failure_in_a_file_names_the_frozen_copy_and_its_line_range():
    rel = "views/mailq.sysmail_sentitems.sql"
    line, cursor = run_plan_until_failure("0001", rel, "Invalid column name 'Nope'. (207)")
    raw = (d.frozen_dir() / "0001" / rel).read_text(encoding="utf-8").rstrip().rstrip(";").rstrip()
    last = raw.count("\n") + 1
    # line 1 is the generated marker, not sent: the batch is lines 2..last
    assert raw.startswith(d.GENERATED_MARKER)
    assert line == (f"mailq-db deploy: failed in revision 0001, file alembic/frozen/0001/{rel}, "
                    f"lines 2-{last}: Invalid column name 'Nope'. (207)")
    assert len(line.splitlines()) == 1
    assert cursor.sent[-1].rstrip().endswith(raw.splitlines()[-1].rstrip())


def test_a_line_named_by_the_message_is_mapped_to_the_file():
    rel = "views/mailq.sysmail_sentitems.sql"
    line, _ = run_plan_until_failure("0001", rel, "Msg 207, Level 16, State 1, Line 5 Invalid column name 'x'.")
    assert f"file alembic/frozen/0001/{rel}, lines 2-" in line
    assert "line 6 (server: batch line 5)" in line  # batch line 1 is file line 2


def test_a_procedure_and_line_named_by_the_message_are_reported_as_given():
    rel = "views/mailq.sysmail_sentitems.sql"
    line, _ = run_plan_until_failure("0001", rel,
                                     "Msg 50201, Level 16, State 1, Procedure mailq.CancelMail, Line 40 no mail")
    assert "procedure mailq.CancelMail line 40" in line


def test_failure_in_a_batch_the_tool_adds_names_it_and_its_position():
    cursor = FakeCursor("mailq_deployment_option", "Login failed. (18456)")
    plan = d.RevisionPlan("0001", d.project_root(), execute=cursor.execute)
    d.reset_progress()
    with pytest.raises(FakePyodbcError) as info:
        plan.upgrade()
    line = describe_failure(info.value)
    assert line.startswith(f"mailq-db deploy: failed in revision 0001, batch {len(cursor.sent)} (")
    assert "lines" not in line and "file" not in line
    assert line.endswith("Login failed. (18456)")


def test_batch_location_counts_from_the_first_line_sent(tmp_path):
    frozen = tmp_path / "alembic" / "frozen" / "0042" / "procedures"
    frozen.mkdir(parents=True)
    (frozen / "x.sql").write_text(f"{d.GENERATED_MARKER} by test\n-- header\nCREATE PROCEDURE x AS\nSELECT 1;\n\n\n",
                                  encoding="utf-8")
    assert d.batch_location("0042", "procedures/x.sql", tmp_path) == ("alembic/frozen/0042/procedures/x.sql", 2, 4)
    (frozen / "y.sql").write_text("CREATE VIEW y AS SELECT 1 AS a\n", encoding="utf-8")
    assert d.batch_location("0042", "procedures/y.sql", tmp_path) == ("alembic/frozen/0042/procedures/y.sql", 1, 1)
    assert d.batch_location("0042", "procedures/missing.sql", tmp_path) is None
