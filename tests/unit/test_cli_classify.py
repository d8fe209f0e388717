"""``mailq-db classify``: --help, output, JSON, argument errors (no database involved)."""

from __future__ import annotations

import io
import json

import pytest

from mailq_db.cli import main


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as info:
        main(["classify", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "mailq-db classify" in out and "--provider" in out and "--stage" in out


def test_prints_disposition_scope_wait_rule_and_source(capsys):
    assert main(["classify", "450 4.7.1 Error: too much mail from 192.0.2.1", "--stage", "mail"]) == 0
    out = capsys.readouterr().out
    assert "disposition: Wait" in out and "scope:       account" in out
    assert "wait:        600 s" in out and "rule:        rate-limit" in out
    assert "source:      https://www.postfix.org/" in out


def test_default_stage_is_rcpt_and_the_provider_is_recognised_from_the_reply(capsys):
    assert main(["classify", "550 5.1.1 The email account that you tried to reach does not exist. - gsmtp"]) == 0
    out = capsys.readouterr().out
    assert "Stop" in out and "recipient" in out and "RCPT, code 550, enhanced status 5.1.1" in out
    assert "gmail (recognised from the reply)" in out


def test_json_with_provider_and_code(capsys):
    assert main(["classify", "Mailbox unavailable or access denied", "--code", "550",
                 "--provider", "qq", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["disposition"] == "Retry" and data["scope"] == "recipient"
    assert data["rule"] == "qq-recipient-frequency" and data["provider"] == "qq"
    assert data["source"].startswith("http") and data["wait_seconds"] == 900


def test_reads_a_multi_line_reply_from_stdin(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(
        "550-5.7.26 This mail has been blocked because the sender is\n550 5.7.26 unauthenticated. - gsmtp\n"))
    assert main(["classify", "-", "--stage", "dot", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["disposition"], data["scope"], data["rule"]) == ("Stop", "mail", "message-authentication")


@pytest.mark.parametrize("argv,message", [
    (["classify", "no code here"], "give --code"),
    (["classify", "550 x", "--code", "450"], "contradicts"),
    (["classify", "550 x", "--code", "700"], "must be 200-599"),
    (["classify", "550 x", "--stage", "helo"], "invalid choice"),
    (["classify"], "reply"),
])
def test_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_sender_refusal_is_scoped_to_the_sender_address(capsys):
    assert main(["classify", "554 Message rejected: Email address is not verified. The following identities "
                 "failed the check in region US-EAST-1: a@example.com", "--stage", "dot"]) == 0
    out = capsys.readouterr().out
    assert "disposition: Stop" in out and "scope:       sender" in out and "never the whole account" in out
