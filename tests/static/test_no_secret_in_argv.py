"""No example puts a secret on a command line (issue 21 point 7): not in any
shell block of README.md or docs/, and not in any `--help` of mailq-db.

A command line is visible to every user of the machine (ps, /proc) and lands
in shell history: passwords come from the environment, loaded from a file
(`set -a; . file; set +a`) or typed with `read -rs`.  Caught here: a URL with a
password, a variable expanded into --url/--db/--source (it carries the URL's
password into argv), and a secret-looking variable assigned a literal value on
a command line."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from test_docs_commands import DOCS, _blocks_of

from mailq_db import cli

ROOT = Path(__file__).resolve().parents[2]

PATTERNS = {
    "a URL with a password": re.compile(r"://[^\s/:@'\"]+:(?!<)[^\s@/'\"]+@"),
    "a variable expanded into argv": re.compile(r"--(?:url|db|source)[ =]\"?\$"),
    "a secret assigned on the command line": re.compile(
        r"(?<![\w#])(?:export\s+)?[A-Z_]*(?:PASSWORD|SECRET|TOKEN|DB_URL)[A-Z_]*=(?!\"?\$)(?!$)\S"),
}


def problems(text: str) -> list[str]:
    return [name for name, pattern in PATTERNS.items() if pattern.search(text)]


def doc_commands() -> list[tuple[str, str]]:
    return [(f"{c.doc}:{c.line}", c.text) for path in DOCS for block in _blocks_of(path) for c in block.commands]


def help_texts() -> dict[str, str]:
    parser = cli.build_parser()
    out = {"mailq-db": parser.format_help()}
    stack = [("mailq-db", parser)]
    while stack:
        name, p = stack.pop()
        for action in p._actions:  # argparse keeps subcommands here
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    out[f"{name} {sub}"] = subparser.format_help()
                    stack.append((f"{name} {sub}", subparser))
    return out


def test_there_is_something_to_check():
    assert len(doc_commands()) > 50 and len(help_texts()) > 15


@pytest.mark.parametrize("where,command", doc_commands(), ids=lambda v: v if ":" in str(v) else None)
def test_no_documented_command_carries_a_secret(where, command):
    assert problems(command) == [], (where, command)


def test_no_help_text_carries_a_secret():
    found = {name: problems(text) for name, text in help_texts().items() if problems(text)}
    assert found == {}


@pytest.mark.parametrize("sample", [
    'mailq-db deploy --url "$MAILQ_DB_URL"',
    "mailq-db doctor --db mssql+pyodbc://worker:pw@sql1/mail",
    "MAILQ_SMTP_DEFAULT_PASSWORD=example-only mailq-db worker --check-config",
    "export MAILQ_DB_URL=mssql+pyodbc://u@h/db",
])
def test_the_checks_catch_each_kind(sample):
    assert problems(sample)


@pytest.mark.parametrize("sample", [
    "read -rs MAILQ_DB_URL && export MAILQ_DB_URL",
    'MAILQ_DB_URL="$URL" python bench/delay_throughput.py',
    "set -a; . examples/worker.env; set +a",
    'mailq-db worker --db "mssql+pyodbc://mailer@sql1/mail"',
])
def test_the_checks_let_the_safe_forms_pass(sample):
    assert problems(sample) == []
