"""The worker's TOML configuration and ``--check-config``'s explanations."""

from __future__ import annotations

import os

import pytest

from mailq_db.errors import ConfigurationError
from mailq_db.worker.config import load_config, parse_config

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "worker.toml")
MINIMAL = '[accounts.default]\nhost = "smtp.example.com"\n'


def test_example_config_is_valid():
    config = load_config(EXAMPLE, env={"MAILQ_SMTP_DEFAULT_PASSWORD": "pw"})
    assert config.worker.batch_size == 50 and config.worker.concurrency == 4
    assert config.worker.app_name is None
    default = config.accounts["default"]
    assert (default.host, default.port, default.tls, default.password) == ("smtp.example.com", 587, "starttls", "pw")
    assert config.accounts["local"].tls == "none"


def test_defaults_are_starttls_on_587():
    a = parse_config(MINIMAL, env={}).accounts["default"]
    assert (a.tls, a.port, a.user, a.verify_tls) == ("starttls", 587, None, True)
    assert parse_config(MINIMAL + 'tls = "implicit"\n', env={}).accounts["default"].port == 465


def problems_of(text: str, env=None) -> str:
    with pytest.raises(ConfigurationError) as info:
        parse_config(text, env=env or {})
    return str(info.value)


@pytest.mark.parametrize("text,expected", [
    ("", "no account"),
    ("[accounts.a]\nport = 25\n", "accounts.a.host: is required"),
    (MINIMAL + 'tls = "none"\n', "allow_plaintext = true"),
    (MINIMAL + 'tls = "ssl"\n', "must be one of starttls, implicit, none"),
    (MINIMAL + 'password = "hunter2"\n', "passwords never go in the file"),
    (MINIMAL + 'user = "u"\n', "name the environment variable"),
    (MINIMAL + 'user = "u"\npassword_env = "NOPE_PW"\n', "NOPE_PW is not set"),
    (MINIMAL + "port = 70000\n", "must be 1-65535"),
    (MINIMAL + "prot = 25\n", "unknown setting"),
    (MINIMAL + "[worker]\nbatch_size = 0\n", "worker.batch_size: must be at least 1"),
    (MINIMAL + "[worker]\nbatch_size = \"10\"\n", "must be int"),
    (MINIMAL + "[worker]\nlease_seconds = 60\nlease_safety_margin_seconds = 40\n", "more than half"),
    (MINIMAL + "[worker]\nidle_backoff_min_seconds = 5\nidle_backoff_max_seconds = 1\n", "at least idle_backoff_min"),
    (MINIMAL + '[database]\nurl = "mssql+pyodbc://sa:secret@h/db"\n', "contains a password"),
    (MINIMAL + '[database]\nurl_env = "NOT_SET_URL"\n', "NOT_SET_URL is not set"),
    (MINIMAL + "[wroker]\n", "unknown section"),
    ("not toml [", "not valid TOML"),
])
def test_each_problem_is_explained(text, expected):
    assert expected in problems_of(text)


def test_every_problem_is_listed_at_once():
    text = problems_of('[accounts.a]\ntls = "none"\n[worker]\nconcurrency = 0\n')
    assert "3 problem(s)" in text
    assert "accounts.a.host" in text and "accounts.a.tls" in text and "worker.concurrency" in text


def test_database_url_from_the_named_variable():
    config = parse_config(MINIMAL + '[database]\nurl_env = "MY_URL"\n', env={"MY_URL": "mssql://h/db"})
    assert config.database.url == "mssql://h/db"
