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
