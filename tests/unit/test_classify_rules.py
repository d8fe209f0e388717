"""The rule table (smtp_rules.toml): its loader, the verdicts the worker relies on,
provider recognition, the generated documentation, and the escalation object."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mailq_db.worker import classify
from mailq_db.worker.classify import (
    ACCOUNT, CONNECTION, MAIL, RECIPIENT, RETRY, SENDER, STOP, TABLE, WAIT, Escalation, EscalationPolicy,
    Outcome, RuleTableError, classify_reply, enhanced_status, parse_rules, resolve_provider, split_reply,
)

ROOT = Path(__file__).resolve().parents[2]
RULES_TOML = ROOT / "src" / "mailq_db" / "worker" / "smtp_rules.toml"

MINIMAL = '''
version = 1
[providers.acme]
hosts = ['(^|\\.)acme\\.example$']
text = ['ACME-MTA']
aliases = ["acmemail"]

[[rule]]
id = "acme-throttle"
providers = ["acme"]
text = 'slow'
disposition = "Wait"
scope = "account"
wait = 60
source = "https://acme.example/smtp"

[[class]]
id = "catch-all"
disposition = "Retry"
scope = "mail"
source = "https://www.rfc-editor.org/rfc/rfc5321"
'''


# --------------------------------------------------------------------------- the loader


def test_the_shipped_table_loads_and_every_rule_has_a_public_source():
    table = classify.load_rules()
    assert len(table.rules) > 30 and len(table.providers) >= 17
    for rule in table.rules:
        assert rule.source.startswith(("https://", "http://")), rule.id
        assert rule.scope in classify.ALLOWED_SCOPES[rule.disposition], rule.id
    # every provider the issue names can be recognised
    for name in ("gmail", "microsoft365", "yahoo", "icloud", "qq", "netease", "aliyun", "zoho", "yandex",
                 "mailru", "sendgrid", "mailgun", "ses", "postfix", "exim", "exchange", "sendmail"):
        assert name in table.providers


def test_no_shipped_pattern_looks_for_a_backslash():
    """SMTP replies carry no backslashes worth a rule: a doubled one in the table's literal strings
    ('\\\\b' where '\\b' was meant) is a pattern that silently never matches."""
    for rule in classify.load_rules().rules:
        for key in ("text", "not_text"):
            pattern = rule.raw.get(key, "")
            assert "\\\\" not in pattern, f"{rule.id}.{key}: {pattern!r}"


def test_a_minimal_table_parses_and_decides():
    table = parse_rules(MINIMAL)
    outcome = classify_reply(450, "please go slow", "mail", "mx1.acme.example", table=table)
    assert (outcome.disposition, outcome.scope, outcome.rule, outcome.retry_after_seconds) == (
        WAIT, ACCOUNT, "acme-throttle", 60)
    # the provider condition: another server saying the same falls through to the catch-all
    assert classify_reply(450, "please go slow", "mail", "mx.other.example", table=table).rule == "catch-all"


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace('wait = 60\n', 'wait = 60\ncolour = "red"\n'), "unknown key(s) colour"),
    (lambda t: t.replace("text = 'slow'", "text = 'slow('"), "bad regular expression in 'text'"),
    (lambda t: t.replace('scope = "account"', 'scope = "mail"'), "a Wait cannot have scope 'mail'"),
    (lambda t: t.replace('scope = "account"', 'scope = "galaxy"'), "scope 'galaxy' is not one of"),
    (lambda t: t.replace('disposition = "Wait"', 'disposition = "Later"'), "disposition 'Later'"),
    (lambda t: t.replace('providers = ["acme"]', 'providers = ["globex"]'), "unknown provider 'globex'"),
    (lambda t: t.replace('source = "https://acme.example/smtp"\n', ''), "'source' is required"),
    (lambda t: t.replace('source = "https://acme.example/smtp"', 'source = "a friend"'), "URL of the public document"),
    (lambda t: t.replace('wait = 60\n', ''), "a Wait needs 'wait'"),
    (lambda t: t.replace("text = 'slow'", "text = 'slow'\nstages = ['helo']"), "unknown stage 'helo'"),
    (lambda t: t.replace("text = 'slow'", "text = 'slow'\ncodes = [650]"), "bad reply code 650"),
    (lambda t: t.replace("text = 'slow'", "text = 'slow'\nstatus = ['7.1']"), "bad enhanced status pattern"),
    (lambda t: t.replace('id = "catch-all"', 'id = "acme-throttle"'), "duplicate rule id 'acme-throttle'"),
    (lambda t: t.replace("version = 1", "version = 1\nrules = []"), "unknown top-level key(s) rules"),
    (lambda t: t.replace("version = 1", "version = 2"), "'version' must be 1"),
    (lambda t: t.replace("hosts = [", "host = ["), "[providers.acme]: unknown key(s) host"),
    (lambda t: t.replace("aliases = [\"acmemail\"]", "aliases = [\"acmemail\"]\ntext = ['(']"),
     "not valid TOML"),
    (lambda t: t.replace('scope = "mail"\nsource', 'scope = "mail"\ncodes = ["5xx"]\nsource'),
     "the last [[class]] rule must match everything"),
])
def test_the_loader_refuses_a_bad_table_with_a_clear_message(edit, message):
    with pytest.raises(RuleTableError) as info:
        parse_rules(edit(MINIMAL))
    assert message in str(info.value)
    assert str(info.value).startswith("smtp_rules.toml: ")


TEXT_OF = MINIMAL.replace("[[class]]", """[[rule]]
id = "acme-refused"
codes = ["5xx"]
text_of = "acme-throttle"
disposition = "Stop"
scope = "mail"
source = "https://acme.example/smtp"

[[class]]""")


def test_text_of_takes_an_earlier_rules_wording():
    table = parse_rules(TEXT_OF)
    assert table.by_id("acme-refused").raw["text"] == "slow"
    assert classify_reply(550, "please go slow", "mail", table=table).rule == "acme-refused"


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace('text_of = "acme-throttle"', 'text_of = "nobody"'), "must name an earlier rule"),
    (lambda t: t.replace('text_of = "acme-throttle"', "text_of = \"acme-throttle\"\ntext = 'x'"),
     "give one or the other"),
])
def test_text_of_refuses_an_unknown_rule_or_a_second_text(edit, message):
    with pytest.raises(RuleTableError, match=message):
        parse_rules(edit(TEXT_OF))


def test_the_loader_names_the_rule_at_fault():
    with pytest.raises(RuleTableError, match=r"\[\[rule\]\] 'acme-throttle': bad regular expression"):
        parse_rules(MINIMAL.replace("text = 'slow'", "text = '[unclosed'"))


# --------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize("stage,code,text,disposition,scope", [
    # Postfix anvil and restrictions (the verdicts the worker's MTA tests rely on)
    ("mail", 450, "4.7.1 Error: too much mail from 192.0.2.1", WAIT, ACCOUNT),
    ("rcpt", 450, "4.7.1 Error: too many recipients from 192.0.2.1", WAIT, ACCOUNT),
    ("connect", 421, "4.7.0 mx.example.com Error: too many connections from 192.0.2.1", WAIT, ACCOUNT),
    ("mail", 421, "4.7.0 mx.example.com Error: too many connections from 192.0.2.1", WAIT, ACCOUNT),
    ("mail", 421, "4.4.2 mx.example.com Error: timeout exceeded", RETRY, CONNECTION),
    ("dot", 421, "4.4.2 mx.example.com Error: timeout exceeded", RETRY, CONNECTION),
    ("mail", 421, "4.7.0 mx.example.com Error: too many errors", RETRY, CONNECTION),
    ("mail", 421, "4.7.0 too many messages in this connection", RETRY, CONNECTION),
    ("rcpt", 450, "4.7.1 <localhost>: Helo command rejected: Host not found", WAIT, ACCOUNT),
    # the relay's own table cannot be read: the server's transient error (escalates), not the recipient's
    ("rcpt", 451, "4.3.0 <x@example.com>: Temporary lookup failure", RETRY, MAIL),
    ("rcpt", 450, "4.4.0 <x@example.com>: Temporary DMARC DNS lookup failure", RETRY, RECIPIENT),
    ("rcpt", 504, "5.5.2 <box>: Helo command rejected: need fully-qualified hostname", WAIT, ACCOUNT),
    ("rcpt", 450, "4.7.1 Client host rejected: cannot find your hostname, [192.0.2.1]", WAIT, ACCOUNT),
    ("rcpt", 554, "5.7.1 <unknown[192.0.2.1]>: Client host rejected: Access denied", WAIT, ACCOUNT),
    ("rcpt", 450, "4.1.8 <s@bad.example>: Sender address rejected: Domain not found", RETRY, SENDER),
    ("rcpt", 553, "5.7.1 <s@example.com>: Sender address rejected: not owned by user bob", STOP, SENDER),
    ("rcpt", 450, "4.2.0 <r@example.com>: Recipient address rejected: Greylisted, see http://postgrey.example", RETRY, RECIPIENT),
    ("rcpt", 451, "4.7.1 Greylisting in action, please come back later", RETRY, RECIPIENT),
    ("rcpt", 452, "4.5.3 Error: too many recipients", RETRY, RECIPIENT),
    ("rcpt", 452, "4.5.3 Too many recipients", RETRY, RECIPIENT),
    ("rcpt", 550, "5.1.1 <r@example.com>: Recipient address rejected: User unknown in local recipient table", STOP, RECIPIENT),
    ("rcpt", 550, "5.1.1 <r@example.com>: Recipient address rejected: User unknown in virtual mailbox table", STOP, RECIPIENT),
    ("rcpt", 554, "5.7.1 <r@example.org>: Relay access denied", WAIT, ACCOUNT),
    ("dot", 552, "5.3.4 Message size exceeds fixed limit", STOP, MAIL),
    ("data", 552, "5.3.4 Message size exceeds fixed limit", STOP, MAIL),
    ("mail", 552, "5.3.4 Message size exceeds fixed limit", STOP, MAIL),
    ("mail", 452, "4.3.1 Insufficient system storage", WAIT, ACCOUNT),
    # issue 15's families
    ("rcpt", 550, "RP:TRC 163 smtp7,C8CowAC http://mail.163.com/help/help_spam_16.htm?ip=192.0.2.1", WAIT, ACCOUNT),
    ("mail", 451, "MI:SFQ 163 smtp7,C8CowAC", WAIT, ACCOUNT),
    ("mail", 550, "Ip frequency limited", WAIT, ACCOUNT),
    ("mail", 550, "5.7.705 Access denied, tenant has exceeded threshold", WAIT, ACCOUNT),
    ("dot", 554, "5.2.0 STOREDRV.Submission.Exception:SubmissionQuotaExceededException", WAIT, ACCOUNT),
    ("mail", 550, "5.7.750 Service unavailable. Client blocked from sending from unregistered domains", WAIT, ACCOUNT),
    ("rcpt", 450, "4.2.1 The user you are trying to contact is receiving mail too quickly. - gsmtp", RETRY, RECIPIENT),
    ("mail", 421, "4.7.0 [TSS04] Messages from 192.0.2.1 temporarily deferred due to unexpected volume", WAIT, ACCOUNT),
    ("mail", 421, "4.3.2 Service shutting down", WAIT, ACCOUNT),
    ("rcpt", 552, "5.2.2 Mailbox full", RETRY, RECIPIENT),  # RFC 5321 4.5.3.1.10
    ("rset", 421, "4.4.2 timeout", RETRY, CONNECTION),
    ("quit", 500, "huh", RETRY, CONNECTION),
    ("mail", 299, "odd", RETRY, MAIL),
    # a temporary refusal of this message's authentication is the mail's; one naming the IP is the account's
    ("dot", 421, "4.7.27 Your email has been rate limited because SPF authentication didn't pass for this "
                 "message. - gsmtp", RETRY, MAIL),
    ("dot", 421, "4.7.32 Your email has been rate limited because the From: header isn't aligned with either "
                 "the authenticated SPF or DKIM organizational domain. - gsmtp", RETRY, MAIL),
    ("dot", 451, "4.7.24 SPF validation error", RETRY, MAIL),
    ("dot", 451, "4.7.24 The SPF record of the sending domain has one or more suspicious entries. To protect "
                 "our users from spam, email sent from your IP address has been temporarily rate limited.", WAIT,
     ACCOUNT),
    ("mail", 421, "4.7.28 Gmail has detected an unusual rate of mail originating from your DKIM domain "
                  "example.com. - gsmtp", WAIT, ACCOUNT),
    # 5.7.30 alone is not Exchange Online's basic-auth refusal (Gmail: DKIM; IANA: REQUIRETLS)
    ("dot", 550, "5.7.30 This message was blocked because it didn't pass DKIM authentication. - gsmtp", STOP, MAIL),
    ("auth", 550, "5.7.30 Basic authentication is not supported for Client Submission.", WAIT, ACCOUNT),
    # RFC 7372 status codes without telling words
    ("rcpt", 550, "5.7.26 Multiple authentication checks failed", STOP, MAIL),
    ("mail", 550, "5.7.25 Reverse DNS validation failed", WAIT, ACCOUNT),
    # 553/556 at MAIL FROM name the sender; at RCPT the recipient
    ("mail", 553, "Requested action not taken: mailbox name not allowed", STOP, SENDER),
    ("mail", 556, "Domain does not accept mail", STOP, SENDER),
    ("rcpt", 553, "Requested action not taken: mailbox name not allowed", STOP, RECIPIENT),
    ("mail", 421, "4.7.0 Connection expired, try reconnecting.", RETRY, CONNECTION),
    ("rcpt", 452, "4.2.2 The recipient's inbox is out of storage space.", RETRY, RECIPIENT),
    # the worker speaks to its account's relay: a deferral that gives no reason is read as the
    # relay's (nothing charged), not as an inbound MX's greylisting; greylisting that says so is
    ("rcpt", 451, "4.7.1 Please try again later", WAIT, ACCOUNT),
    ("rcpt", 450, "4.2.0 Greylisted, please try again later", RETRY, RECIPIENT),
    ("rcpt", 451, "4.7.500 Server busy. Please try again later from [192.0.2.1]. (S77714)", WAIT, ACCOUNT),
    ("rcpt", 450, "4.7.1 Rate limit exceeded, please try again later", WAIT, ACCOUNT),
    ("rcpt", 451, "Error getting LDAP results in map", RETRY, MAIL),
])
def test_verdicts(stage, code, text, disposition, scope):
    outcome = classify_reply(code, text, stage)
    assert (outcome.disposition, outcome.scope) == (disposition, scope), outcome.reason
    assert outcome.source and TABLE.by_id(outcome.rule) is not None
    if disposition == WAIT:
        assert outcome.retry_after_seconds and outcome.account_wide


def test_data_is_an_alias_of_dot():
    for code, text in [(554, "5.7.1 Message rejected as spam"), (451, "4.3.0 Local error"), (552, "5.3.4 too big")]:
        a, b = classify_reply(code, text, "data"), classify_reply(code, text, "dot")
        assert (a.disposition, a.scope, a.rule) == (b.disposition, b.scope, b.rule)


def test_a_recipient_scope_outside_rcpt_is_about_the_mail():
    outcome = classify_reply(550, "5.1.1 user unknown", "dot")
    assert outcome.scope == MAIL and outcome.disposition == STOP


def test_before_any_mail_a_refusal_is_an_account_wait():
    outcome = classify_reply(554, "5.7.1 message content rejected", "connect")
    assert (outcome.disposition, outcome.scope) == (WAIT, ACCOUNT)
    assert "before any mail" in outcome.reason
    assert classify_reply(421, "4.4.2 Error: timeout exceeded", "ehlo").scope == CONNECTION


def test_the_provider_decides_an_ambiguous_reply():
    text = "Mailbox unavailable or access denied [MJ7ck2W1mPNL2eHcjZAe1Hn9]"
    assert (classify_reply(550, text, "rcpt", "qq").disposition, classify_reply(550, text, "rcpt", "qq").scope) \
        == (RETRY, RECIPIENT)
    assert classify_reply(550, text, "rcpt").disposition == STOP
    assert classify_reply(550, text, "rcpt", "smtp.exmail.qq.com").disposition == RETRY


def test_outcome_scope_defaults_from_the_disposition():
    assert Outcome(WAIT, "x", "r").scope == ACCOUNT
    assert Outcome(STOP, "x", "r").scope == MAIL
    assert Outcome(RETRY, "x", "r", scope=CONNECTION).scope == CONNECTION


# --------------------------------------------------------------------------- parsing helpers


@pytest.mark.parametrize("hints,expected", [
    (("qq",), "qq"), (("Exmail",), "qq"), (("smtp.gmail.com",), "gmail"), (("aspmx.l.google.com.",), "gmail"),
    (("220 smtp.office365.com Microsoft ESMTP MAIL Service ready",), "microsoft365"),
    (("mx-eu.mail.am0.yahoodns.net",), "yahoo"), (("smtp.163.com",), "netease"), (("126",), "netease"),
    (("smtp.mxhichina.com",), "aliyun"), (("smtp.zoho.eu",), "zoho"), (("smtp.yandex.ru",), "yandex"),
    (("smtp.mail.ru",), "mailru"), (("smtp.sendgrid.net",), "sendgrid"), (("smtp.mailgun.org",), "mailgun"),
    (("email-smtp.eu-west-1.amazonaws.com",), "ses"), (("220 mx.example.com ESMTP Postfix (Debian)",), "postfix"),
    (("220 mx.example.com ESMTP Exim 4.96",), "exim"), (("smtp.mail.me.com",), "icloud"),
    ((None, "", "mx.unknown.example"), None), ((None, "smtp.gmail.com"), "gmail"),
    (("5.7.1 blocked - gsmtp",), "gmail"),
])
def test_resolve_provider(hints, expected):
    assert resolve_provider(*hints) == expected


def test_enhanced_status_ignores_addresses_and_yahoo_codes():
    assert enhanced_status("5.7.1 <x@example.com> rejected") == (5, 7, 1)
    assert enhanced_status("blocked [192.0.2.1] see 4.16.55.1") is None
    assert enhanced_status("Sorry (#5.1.1)") == (5, 1, 1)


def test_split_reply_handles_multi_line_replies():
    assert split_reply("550-5.7.26 This mail is unauthenticated\n550 5.7.26 see help - gsmtp") == (
        550, "5.7.26 This mail is unauthenticated see help - gsmtp")
    # smtplib hands over the lines without the code, the status repeated on each
    outcome = classify_reply(550, b"5.7.26 blocked because the sender is\n5.7.26 unauthenticated. - gsmtp", "dot")
    assert outcome.rule == "message-authentication"
    assert split_reply("no code here") == (None, "no code here")
    assert split_reply("421") == (421, "")


# --------------------------------------------------------------------------- documentation


def test_the_doc_lists_the_table_as_generated():
    doc = (ROOT / "docs" / "smtp-classification.md").read_text(encoding="utf-8")
    assert doc == classify.update_doc(doc), (
        "docs/smtp-classification.md is stale: run "
        "python -m mailq_db.worker.classify --update-doc docs/smtp-classification.md")
    for rule in TABLE.rules:
        assert f"`{rule.id}`" in doc


def test_the_package_ships_the_table_beside_the_module():
    from importlib import resources
    assert resources.files("mailq_db.worker").joinpath("smtp_rules.toml").is_file()
    assert RULES_TOML.is_file()


# --------------------------------------------------------------------------- escalation


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def retry(text="4.3.0 temporary problem") -> Outcome:
    return classify_reply(451, text, "mail")


def test_repeated_retries_become_one_account_wait_logged_once(caplog):
    clock = Clock()
    esc = Escalation(EscalationPolicy(retry_threshold=3, retry_window_seconds=60, retry_wait_seconds=120), clock)
    caplog.set_level(logging.WARNING, logger="mailq_db.worker.classify")
    assert esc.observe("a", retry()).disposition == RETRY
    clock.now += 10
    assert esc.observe("a", retry()).disposition == RETRY
    assert esc.observe("b", retry()).disposition == RETRY  # another account counts apart
    clock.now += 10
    escalated = esc.observe("a", retry())
    assert (escalated.disposition, escalated.scope, escalated.retry_after_seconds) == (WAIT, ACCOUNT, 120)
    assert escalated.rule.startswith("escalation:") and "escalated" in escalated.reason
    for _ in range(3):  # the count starts over after an escalation, and it is not logged again
        esc.observe("a", retry())
    assert len([r for r in caplog.records if "temporary failures within" in r.getMessage()]) == 1


def test_retries_outside_the_window_do_not_escalate():
    clock = Clock()
    esc = Escalation(EscalationPolicy(retry_threshold=3, retry_window_seconds=60), clock)
    for _ in range(5):
        assert esc.observe("a", retry()).disposition == RETRY
        clock.now += 31


def test_success_forgets_the_account():
    clock = Clock()
    esc = Escalation(EscalationPolicy(retry_threshold=2, retry_window_seconds=60), clock)
    esc.observe("a", retry())
    esc.success("a")
    assert esc.observe("a", retry()).disposition == RETRY


def test_a_wait_that_keeps_coming_back_is_lengthened_up_to_the_cap(caplog):
    clock = Clock()
    esc = Escalation(EscalationPolicy(wait_growth=2, wait_max_seconds=1000, wait_memory_seconds=100), clock)
    caplog.set_level(logging.WARNING, logger="mailq_db.worker.classify")
    wait = classify_reply(450, "4.7.1 Error: too much mail from 192.0.2.1", "mail")
    base = wait.retry_after_seconds
    seen = []
    for _ in range(4):
        out = esc.observe("a", wait)
        seen.append(out.retry_after_seconds)
        clock.now += out.retry_after_seconds + 50  # comes back soon after the block ends
    assert seen == [base, min(2 * base, 1000), min(4 * base, 1000), 1000]
    assert len([r for r in caplog.records if "back-off now" in r.getMessage()]) == 3
    clock.now += 10_000  # long quiet: the next Wait starts from its own length again
    assert esc.observe("a", wait).retry_after_seconds == base


def test_escalation_can_be_switched_off_and_configured_from_a_table():
    esc = Escalation(EscalationPolicy.from_mapping({"retry_threshold": 0, "wait_growth": 1}), Clock())
    for _ in range(50):
        assert esc.observe("a", retry()).disposition == RETRY
    wait = classify_reply(421, "4.3.2 Service not available", "mail")
    assert [esc.observe("a", wait).retry_after_seconds for _ in range(3)] == [wait.retry_after_seconds] * 3
    with pytest.raises(ValueError, match="unknown key"):
        EscalationPolicy.from_mapping({"retry_treshold": 3})
    with pytest.raises(ValueError):
        EscalationPolicy(wait_growth=0.5)


# --------------------------------------------------------------------------- exceptions keep their verdicts, with a scope


def test_classify_exception_scopes():
    import smtplib
    import socket

    from mailq_db.worker.classify import NeedsSmtpUtf8, SetupError, classify_exception

    def pair(exc, stage, provider=None):
        out = classify_exception(exc, stage, provider)
        return out.disposition, out.scope

    assert pair(smtplib.SMTPServerDisconnected("gone"), "dot") == (RETRY, CONNECTION)
    assert pair(socket.timeout("timed out"), "rcpt") == (RETRY, CONNECTION)
    assert pair(ConnectionRefusedError(111, "refused"), "connect") == (WAIT, ACCOUNT)
    assert pair(socket.timeout("timed out"), "ehlo") == (WAIT, ACCOUNT)
    assert pair(SetupError("STARTTLS required but not offered"), "starttls") == (WAIT, ACCOUNT)
    assert pair(NeedsSmtpUtf8("no SMTPUTF8"), "mail") == (STOP, MAIL)
    assert pair(ValueError("bug"), "dot") == (RETRY, MAIL)
    assert pair(smtplib.SMTPSenderRefused(450, b"4.7.1 Error: too much mail from 192.0.2.1", "a@b"), "mail") \
        == (WAIT, ACCOUNT)
    refused = smtplib.SMTPRecipientsRefused({"a@b": (550, b"5.1.1 User unknown"), "c@d": (450, b"4.2.0 Greylisted")})
    assert pair(refused, "rcpt") == (STOP, RECIPIENT)
    # the provider reaches the replies carried by exceptions
    qq = smtplib.SMTPRecipientsRefused({"a@qq.com": (550, b"Mailbox unavailable or access denied")})
    assert pair(qq, "rcpt", "qq") == (RETRY, RECIPIENT)
    assert pair(smtplib.SMTPDataError(552, b"5.3.4 Message size exceeds fixed limit"), "data") == (STOP, MAIL)
