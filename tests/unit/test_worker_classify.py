"""The Retry/Wait/Stop table (docs/smtp-classification.md) without a server."""

from __future__ import annotations

import smtplib
import socket
import ssl

import pytest

from mailq_db.worker.classify import (
    RETRY, STOP, WAIT, NeedsSmtpUtf8, SetupError, classify_exception, classify_reply,
)


@pytest.mark.parametrize("code,text,stage,expected", [
    (421, "4.3.2 Service shutting down", "mail", WAIT),
    (421, "closing", "connect", WAIT),
    (450, "4.2.1 Mailbox busy", "rcpt", RETRY),
    (450, "4.2.1 The user you are trying to contact is receiving mail too quickly", "rcpt", RETRY),
    (450, "4.7.1 Too many messages, slow down", "mail", WAIT),
    (451, "4.3.0 Local error in processing", "data", RETRY),
    (451, "4.7.0 Temporary rate limit exceeded", "mail", WAIT),
    (452, "4.3.1 Insufficient system storage", "data", WAIT),
    (452, "4.5.3 Too many recipients", "rcpt", RETRY),  # issue 15: recipient Retry
    (454, "4.7.0 Temporary authentication failure", "auth", WAIT),
    (454, "4.7.0 TLS not available", "connect", WAIT),
    (454, "4.7.1 Relay access denied temporarily", "rcpt", WAIT),  # issue 15: relay refused = account
    (454, "4.7.0 account locked", "rcpt", WAIT),
    (535, "5.7.8 Authentication credentials invalid", "auth", WAIT),
    (550, "5.1.1 No such user", "rcpt", STOP),
    (550, "5.4.5 Daily user sending quota exceeded", "mail", WAIT),
    (551, "5.1.6 User not local", "rcpt", STOP),
    (552, "5.3.4 Message size exceeds fixed limit", "data", STOP),
    (552, "5.2.2 Mailbox full", "mail", STOP),
    (552, "5.5.3 Too many recipients", "rcpt", RETRY),
    (553, "5.1.3 Bad address syntax", "mail", STOP),
    (554, "5.7.1 Message rejected as spam", "data", STOP),
    (554, "No SMTP service here", "connect", WAIT),
    (299, "odd", "data", RETRY),
])
def test_table(code, text, stage, expected):
    outcome = classify_reply(code, text, stage)
    assert outcome.disposition == expected, outcome.rule
    assert outcome.smtp_code == code and text in outcome.reason and stage.upper() in outcome.reason
    if expected == WAIT:
        assert outcome.retry_after_seconds and outcome.account_wide


def test_every_disposition_names_its_rule():
    outcome = classify_reply(550, "x", "rcpt")
    assert outcome.rule == "class-rcpt-permanent" and outcome.scope == "recipient"
    assert outcome.source and outcome.source.startswith("https://")


@pytest.mark.parametrize("exc,stage,expected", [
    (smtplib.SMTPServerDisconnected("Connection unexpectedly closed"), "data", RETRY),
    (socket.timeout("timed out"), "rcpt", RETRY),
    (ConnectionRefusedError(111, "Connection refused"), "connect", WAIT),
    (socket.timeout("timed out"), "connect", WAIT),
    (ssl.SSLError("certificate verify failed"), "connect", WAIT),
    (SetupError("STARTTLS required but not offered"), "connect", WAIT),
    (NeedsSmtpUtf8("no SMTPUTF8"), "mail", STOP),
    (smtplib.SMTPAuthenticationError(535, b"5.7.8 bad credentials"), "auth", WAIT),
    (smtplib.SMTPSenderRefused(553, b"5.1.8 bad sender", "a@b"), "mail", STOP),
    (smtplib.SMTPDataError(554, b"5.7.1 spam"), "data", STOP),
    (smtplib.SMTPRecipientsRefused({"a@b": (550, b"no"), "c@d": (450, b"busy")}), "rcpt", STOP),
    (smtplib.SMTPRecipientsRefused({"a@b": (550, b"no"), "c@d": (421, b"bye")}), "rcpt", WAIT),
    (ValueError("bug"), "data", RETRY),
])
def test_exceptions(exc, stage, expected):
    assert classify_exception(exc, stage).disposition == expected


def test_unknown_stage_is_a_programming_error():
    with pytest.raises(ValueError):
        classify_reply(550, "x", "helo")
