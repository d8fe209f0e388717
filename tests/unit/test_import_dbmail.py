"""``mailq-db import-dbmail``: the parsing of msdb's rows, the import plan and
the worker configuration skeleton.

A fake cursor stands in for msdb: it answers the command's five SELECTs with
fixed rows.  These tests cover only the Python logic (how rows become
accounts, profiles, grants, plan steps and TOML); they never claim to test a
procedure.  What the procedures do is tested on SQL Server 2022 in
tests/integration/test_dbmail_send.py.
"""

from __future__ import annotations

import io

import pytest

from mailq_db.cli import build_parser
from mailq_db.commands import import_dbmail as imp
from mailq_db.errors import InvalidInputError, MailStateError
from mailq_db.worker.config import parse_config


class FakeCursor:
    """Answers each known SELECT with its rows; fails on anything else (no writes to msdb)."""

    def __init__(self, answers: dict[str, list[tuple]]):
        self.answers = answers
        self.executed: list[str] = []
        self._rows: list[tuple] = []

    def execute(self, sql: str, *params):
        assert sql.lstrip().upper().startswith("SELECT"), sql
        assert sql in self.answers, f"unexpected SQL: {sql}"
        self.executed.append(sql)
        self._rows = self.answers[sql]
        return self

    def fetchall(self):
        return list(self._rows)


def msdb(**overrides) -> FakeCursor:
    answers = {
        imp.ACCOUNTS_SQL: [
            (1, "Primary SMTP", "main relay", "sql@example.com", "SQL Server", None),
            (2, "backup relay", None, "sql@example.com", None, "dba@example.com"),
            (3, "Local", None, "local@example.com", None, None),
        ],
        imp.SERVERS_SQL: [
            (1, "SMTP", "smtp.example.com", 587, "sql@example.com", False, True),
            (2, "SMTP", "smtp2.example.com", 465, "sql@example.com", False, True),
            (3, "SMTP", "localhost", 25, None, False, False),
        ],
        imp.PROFILES_SQL: [(10, "Ops", "alerts"), (11, "Reports", None)],
        imp.PROFILE_ACCOUNTS_SQL: [(10, 2, 2), (10, 1, 1), (11, 3, 1)],
        imp.PRINCIPALS_SQL: [(10, "public", True), (11, "ReportUser", False), (11, None, False)],
    }
    answers.update(overrides)
    return FakeCursor(answers)


def test_reads_accounts_servers_profiles_and_grants():
    config = imp.read_msdb(msdb())
    names = [a.name for a in config.accounts]
    assert names == ["Primary SMTP", "backup relay", "Local"]
    primary = config.accounts[0]
    assert (primary.email_address, primary.display_name) == ("sql@example.com", "SQL Server")
    assert primary.server.host == "smtp.example.com" and primary.server.port == 587
    ops = config.profiles[0]
    assert ops.accounts == [(2, "backup relay"), (1, "Primary SMTP")]
    assert ops.principals == [("public", True)]
    reports = config.profiles[1]
    assert reports.principals == [("ReportUser", False)]  # the unknown principal is skipped ...
    assert any("no longer knows" in w for w in config.warnings)  # ... with a warning
    assert any("reply-to" in w and "backup relay" in w for w in config.warnings)


def test_non_smtp_server_and_windows_credentials_are_warned_about():
    cursor = msdb(**{imp.SERVERS_SQL: [
        (1, "SMTP", "smtp.example.com", 587, None, True, True),
        (2, "EXCHANGE", "x", 25, None, False, False),
    ]})
    config = imp.read_msdb(cursor)
    assert config.accounts[1].server is None
    assert any("not SMTP" in w for w in config.warnings)
    assert any("use_default_credentials" in w for w in config.warnings)


def test_plan_follows_the_failover_order_and_can_skip_accounts():
    config = imp.read_msdb(msdb())
    texts = [s.text for s in imp.plan_import(config)]
    assert texts[:3] == [
        "sending account Primary SMTP (from sql@example.com)",
        "sending account backup relay (from sql@example.com)",
        "sending account Local (from local@example.com)",
    ]
    ops = texts.index("profile Ops")
    assert texts[ops + 1: ops + 4] == [
        "profile Ops: account Primary SMTP at 1",
        "profile Ops: account backup relay at 2",
        "profile Ops: granted to public (default)",
    ]
    assert not any(t.startswith("sending account") for t in (s.text for s in imp.plan_import(config, accounts=False)))


def test_apply_calls_the_wrappers_with_named_values(monkeypatch):
    calls = []
    for name in ("upsert_sending_account", "upsert_db_mail_profile", "upsert_db_mail_profile_account",
                 "upsert_db_mail_principal_profile"):
        monkeypatch.setattr(imp.procedures, name, lambda conn, _n=name, **kw: calls.append((_n, kw)))
    config = imp.read_msdb(msdb())
    skipped = imp.apply_steps(object(), imp.plan_import(config), out=io.StringIO())
    assert skipped == []
    assert ("upsert_sending_account", {"account_name": "Primary SMTP", "default_from_address": "sql@example.com",
                                       "default_from_name": "SQL Server"}) in calls
    assert ("upsert_db_mail_profile_account", {"profile_name": "Ops", "account_name": "backup relay",
                                               "sequence_number": 2}) in calls
    assert ("upsert_db_mail_principal_profile", {"profile_name": "Ops", "principal_name": "public",
                                                 "is_default": True}) in calls


def test_missing_principal_is_skipped_other_errors_stop(monkeypatch):
    def missing(conn, **kw):
        raise MailStateError(50254, "no such principal")

    monkeypatch.setattr(imp.procedures, "upsert_db_mail_principal_profile", missing)
    monkeypatch.setattr(imp.procedures, "upsert_db_mail_profile", lambda conn, **kw: 1)
    monkeypatch.setattr(imp.procedures, "upsert_db_mail_profile_account", lambda conn, **kw: None)
    config = imp.read_msdb(msdb())
    skipped = imp.apply_steps(object(), imp.plan_import(config, accounts=False), out=io.StringIO())
    assert len(skipped) == 2 and all("skipped" in s for s in skipped)

    def bad(conn, **kw):
        raise InvalidInputError(50198, "bad")

    monkeypatch.setattr(imp.procedures, "upsert_db_mail_profile", bad)
    with pytest.raises(InvalidInputError):
        imp.apply_steps(object(), imp.plan_import(config, accounts=False), out=io.StringIO())


def test_skeleton_marks_password_placeholders_and_parses_once_they_are_set():
    config = imp.read_msdb(msdb())
    text = imp.worker_config_skeleton(config)
    assert 'password_env = "MAILQ_SMTP_PRIMARY_SMTP_PASSWORD"' in text
    assert 'password_env = "MAILQ_SMTP_BACKUP_RELAY_PASSWORD"' in text
    assert text.count(imp.PLACEHOLDER) >= 3
    assert "password =" not in text.replace("password_env =", "")  # never a password
    assert '[accounts."backup relay"]' in text
    assert 'tls = "implicit"' in text and 'tls = "starttls"' in text
    env = {"MAILQ_SMTP_PRIMARY_SMTP_PASSWORD": "x", "MAILQ_SMTP_BACKUP_RELAY_PASSWORD": "y", "MAILQ_DB_URL": "u"}
    parsed = parse_config(text, env=env)
    assert set(parsed.accounts) == {"Primary SMTP", "backup relay", "Local"}
    assert parsed.accounts["Local"].tls == "none" and parsed.accounts["Local"].allow_plaintext
    with pytest.raises(Exception) as info:
        parse_config(text, env={"MAILQ_DB_URL": "u"})
    assert "MAILQ_SMTP_PRIMARY_SMTP_PASSWORD" in str(info.value)


def test_env_name_is_a_safe_variable_name():
    assert imp.env_name("Primary SMTP") == "MAILQ_SMTP_PRIMARY_SMTP_PASSWORD"
    assert imp.env_name("关系-relay.1") == "MAILQ_SMTP_RELAY_1_PASSWORD"
    assert imp.env_name("***") == "MAILQ_SMTP_ACCOUNT_PASSWORD"


def test_command_is_registered():
    args = build_parser().parse_args(["import-dbmail", "--source", "mssql://x/msdb", "--dry-run"])
    assert args.func is imp.run and args.dry_run


# --------------------------------------------------------------------------
# Overwrite, dry run, source errors, the source password (issue 25, M6/L6)
# --------------------------------------------------------------------------

import argparse  # noqa: E402

from mailq_db.commands import import_dbmail as cmd  # noqa: E402
from mailq_db.errors import ConfigurationError, MailqError  # noqa: E402


def _args(tmp_path, **kw):
    base = dict(source="mssql+pyodbc://sa@old/msdb", source_password_env="MAILQ_DBMAIL_SOURCE_PASSWORD",
                db=None, config_out=str(tmp_path / "worker.toml"), no_accounts=False, dry_run=False, force=False)
    base.update(kw)
    return argparse.Namespace(**base)


def _empty_config(monkeypatch, seen=None):
    monkeypatch.setattr(cmd, "read_source", lambda url: (seen.append(url) if seen is not None else None)
                        or cmd.DbMailConfig(accounts=[], profiles=[]))


def test_an_existing_config_file_is_kept_without_force(tmp_path, monkeypatch):
    _empty_config(monkeypatch)
    target = tmp_path / "worker.toml"
    target.write_text("# hand-tuned\n")
    with pytest.raises(ConfigurationError, match="exists: pass --force"):
        cmd.run(_args(tmp_path))
    assert target.read_text() == "# hand-tuned\n"


def test_dry_run_writes_nothing_even_an_absent_file(tmp_path, monkeypatch, capsys):
    _empty_config(monkeypatch)
    target = tmp_path / "worker.toml"
    target.write_text("# hand-tuned\n")
    assert cmd.run(_args(tmp_path, dry_run=True)) == 0
    assert target.read_text() == "# hand-tuned\n"
    assert "would write" in capsys.readouterr().out
    fresh = tmp_path / "new.toml"
    assert cmd.run(_args(tmp_path, dry_run=True, config_out=str(fresh))) == 0
    assert not fresh.exists()


def test_force_overwrites(tmp_path, monkeypatch):
    _empty_config(monkeypatch)
    monkeypatch.setattr(cmd, "connect", lambda url: type("C", (), {"close": lambda self: None})())
    monkeypatch.setattr(cmd, "apply_steps", lambda conn, steps: [])
    target = tmp_path / "worker.toml"
    target.write_text("# old\n")
    assert cmd.run(_args(tmp_path, force=True)) == 0
    assert target.read_text() != "# old\n"


def test_the_source_password_comes_from_the_environment_never_argv(tmp_path):
    with pytest.raises(ConfigurationError, match="must not hold a password"):
        cmd.source_url(_args(tmp_path, source="mssql+pyodbc://sa:secret@old/msdb"), {})
    url = cmd.source_url(_args(tmp_path), {"MAILQ_DBMAIL_SOURCE_PASSWORD": "p@ss:w/rd"})
    assert url == "mssql+pyodbc://sa:p%40ss%3Aw%2Frd@old/msdb"
    whole = cmd.source_url(_args(tmp_path, source=None), {"MAILQ_DBMAIL_SOURCE_URL": "mssql+pyodbc://u:x@h/msdb"})
    assert whole == "mssql+pyodbc://u:x@h/msdb"
    with pytest.raises(ConfigurationError, match="no source given"):
        cmd.source_url(_args(tmp_path, source=None), {})


def test_a_source_read_error_is_one_line(monkeypatch):
    class DriverError(Exception):
        pass

    def boom(url):
        raise DriverError("42000", "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]The SELECT permission "
                                   "was denied on the object 'sysmail_account'. (229) (SQLExecDirectW)")

    monkeypatch.setattr("mailq_db.procedures._DRIVER_ERRORS", (DriverError,))
    monkeypatch.setattr(cmd, "connect", boom)
    with pytest.raises(MailqError) as err:
        cmd.read_source("mssql+pyodbc://sa@old/msdb")
    assert "\n" not in str(err.value) and "SELECT permission was denied" in str(err.value)
