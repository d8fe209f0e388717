"""VERP tokens, the worker's return path and the RFC 8058 headers of bulk mail."""

from __future__ import annotations

import base64
import email
import email.policy

import pytest
from fake_queue import make_mail

from mailq_db.bounces import outgoing, verp
from mailq_db.errors import ConfigurationError
from mailq_db.worker.config import AccountConfig, parse_config
from mailq_db.worker.message import build

KEY = b"k" * 32
OTHER = b"o" * 32


def settings(**kw):
    values = dict(return_path="bounces+{token}@bounce.example.com",
                  unsubscribe_url="https://mail.example.com/u/{token}",
                  unsubscribe_mailto="bounces+{token}@bounce.example.com", keys=(KEY,))
    values.update(kw)
    return verp.BounceSettings(**values)


def test_token_round_trip_length_and_purpose_separation():
    s = verp.Signer([KEY])
    token = s.token(verp.BOUNCE, 123456789, 1)
    assert len(token) == 24 and token == token.lower()  # 4 + 1 payload + 10 MAC bytes, base32
    assert s.verify(verp.BOUNCE, token) == verp.Token("b", 123456789, 1)
    assert s.verify(verp.BOUNCE, token.upper()) == verp.Token("b", 123456789, 1)  # local parts lose case
    assert s.verify(verp.UNSUBSCRIBE, token) is None  # a return-path token is no unsubscribe link
    assert verp.Signer([OTHER]).verify(verp.BOUNCE, token) is None
    assert len(s.token(verp.BOUNCE, 2**35 - 1, 127)) == 26


def test_every_altered_token_is_refused():
    s = verp.Signer([KEY])
    token = s.token(verp.BOUNCE, 42, 0)
    raw = bytearray(base64.b32decode(token.upper() + "=" * (-len(token) % 8)))
    for i in range(len(raw)):
        for bit in (1, 0x80):
            changed = bytearray(raw)
            changed[i] ^= bit
            forged = base64.b32encode(bytes(changed)).decode().rstrip("=").lower()
            assert s.verify(verp.BOUNCE, forged) is None
    # the MAC of mail 42 does not carry over to mail 43
    other = base64.b32encode(bytes([43]) + bytes(raw[1:])).decode().rstrip("=").lower()
    assert s.verify(verp.BOUNCE, other) is None


def test_rotation_verifies_with_the_previous_key_and_signs_with_the_new():
    old = verp.Signer([OTHER]).token(verp.BOUNCE, 7, 1)
    rotated = verp.Signer([KEY, OTHER])
    assert rotated.verify(verp.BOUNCE, old) == verp.Token("b", 7, 1)
    assert verp.Signer([KEY]).verify(verp.BOUNCE, rotated.token(verp.BOUNCE, 7, 1)) is not None


def test_find_reads_the_plus_detail_of_any_address():
    s = verp.Signer([KEY])
    token = s.token(verp.BOUNCE, 9, 1)
    found = s.find(["someone@example.com", f"BOUNCES+{token.upper()}@Bounce.Example.com"])
    assert found == verp.Token("b", 9, 1)
    altered = ("b" if token[0] != "b" else "c") + token[1:]
    assert s.find([f"bounces+{altered}@bounce.example.com"]) is None
    # the last character's unused bits: another spelling of the same bytes is refused too
    last = "abcdefghijklmnopqrstuvwxyz234567"
    respelled = token[:-1] + last[last.index(token[-1]) ^ 1]
    assert s.find([f"bounces+{respelled}@bounce.example.com"]) is None


def test_short_keys_are_refused():
    with pytest.raises(verp.TokenError):
        verp.Signer([b"short"])
    with pytest.raises(verp.TokenError):
        verp.Signer([])


def test_prepare_sets_the_verp_envelope_sender_and_keeps_from():
    mail = make_mail(77, to_address="a@example.org")
    account = AccountConfig(name="default", host="h", bounces=settings())
    out = outgoing.prepare(mail, account, build)
    local, _, domain = out.envelope_from.partition("@")
    assert domain == "bounce.example.com" and local.startswith("bounces+")
    assert verp.Signer([KEY]).verify(verp.BOUNCE, local.split("+")[1]) == verp.Token("b", 77, 1)
    msg = email.message_from_bytes(out.data, policy=email.policy.default)
    assert msg["From"] == "sender@example.com" and "List-Unsubscribe" not in msg


def test_multi_recipient_mail_carries_recipient_number_zero():
    mail = make_mail(78, to_address="a@example.org; b@example.org")
    out = outgoing.prepare(mail, AccountConfig(name="default", host="h", bounces=settings()), build)
    token = out.envelope_from.split("+")[1].split("@")[0]
    assert verp.Signer([KEY]).verify(verp.BOUNCE, token).recipient_no == 0


def test_bulk_mail_gets_signed_one_click_headers_and_loses_the_marker():
    mail = make_mail(79, to_address="reader@example.org", headers={"X-Mailq-Category": "bulk", "X-Campaign": "7"})
    out = outgoing.prepare(mail, AccountConfig(name="default", host="h", bounces=settings()), build)
    msg = email.message_from_bytes(out.data, policy=email.policy.default)
    assert "X-Mailq-Category" not in msg and msg["X-Campaign"] == "7"
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    https, mailto = [u.strip(" <>") for u in str(msg["List-Unsubscribe"]).split(",")]
    token = https.rsplit("/", 1)[1]
    assert https.startswith("https://mail.example.com/u/")
    assert verp.Signer([KEY]).verify(verp.UNSUBSCRIBE, token) == verp.Token("u", 79, 1)
    assert mailto == f"mailto:bounces+{token}@bounce.example.com?subject=unsubscribe"


@pytest.mark.parametrize("headers,to", [
    ({"X-Mailq-Category": "bulk", "List-Unsubscribe": "<https://app.example/u/1>"}, "r@example.org"),
    ({"X-Mailq-Category": "transactional"}, "r@example.org"),
    ({"X-Mailq-Category": "bulk"}, "r@example.org; s@example.org"),
])
def test_no_one_click_headers_when_the_app_wrote_its_own_or_not_bulk_or_several_recipients(headers, to):
    mail = make_mail(80, to_address=to, headers=headers)
    out = outgoing.prepare(mail, AccountConfig(name="default", host="h", bounces=settings()), build)
    msg = email.message_from_bytes(out.data, policy=email.policy.default)
    assert "X-Mailq-Category" not in msg and "List-Unsubscribe-Post" not in msg
    assert msg["List-Unsubscribe"] == headers.get("List-Unsubscribe")


def test_without_bounce_settings_nothing_changes():
    mail = make_mail(81, headers={"X-Mailq-Category": "bulk"})
    out = outgoing.prepare(mail, AccountConfig(name="default", host="h"), build)
    assert out.envelope_from == "sender@example.com"


CONFIG = """
[accounts.news]
host = "smtp.example.com"
[accounts.news.bounces]
return_path = "bounces+{token}@bounce.example.com"
unsubscribe_url = "https://mail.example.com/u/{token}"
unsubscribe_mailto = "bounces+{token}@bounce.example.com"
"""


def test_config_reads_the_bounces_table_and_the_key_from_the_environment():
    cfg = parse_config(CONFIG, env={"MAILQ_BOUNCE_KEY": "x" * 40})
    b = cfg.accounts["news"].bounces
    assert b.return_path == "bounces+{token}@bounce.example.com" and b.keys == (b"x" * 40,)
    assert "x" * 40 not in repr(cfg)  # the key never shows in a repr or log line


def test_config_problems_are_listed():
    text = CONFIG.replace('"https://mail.example.com/u/{token}"', '"http://mail.example.com/u"') \
        .replace('return_path = "bounces+{token}@bounce.example.com"', 'return_path = "bounces@example.com"\nfoo = 1')
    with pytest.raises(ConfigurationError) as err:
        parse_config(text, env={})
    message = str(err.value)
    assert "accounts.news.bounces.return_path" in message and "local+{token}@domain" in message
    assert "accounts.news.bounces.unsubscribe_url" in message and "https://" in message
    assert "accounts.news.bounces.foo: unknown setting" in message
    assert "MAILQ_BOUNCE_KEY is not set" in message


def test_every_mail_of_an_account_with_bounce_settings_carries_its_token_in_x_mailq_token():
    mail = make_mail(82, to_address="a@example.org", headers={"X-Mailq-Token": "forged-by-the-app"})
    out = outgoing.prepare(mail, AccountConfig(name="default", host="h", bounces=settings(return_path=None)), build)
    msg = email.message_from_bytes(out.data, policy=email.policy.default)
    assert msg.get_all("X-Mailq-Token") == [msg["X-Mailq-Token"]]  # the application's is replaced
    assert verp.Signer([KEY]).find([msg["X-Mailq-Token"]]) == verp.Token("b", 82, 1)
    assert out.envelope_from == "sender@example.com"  # no return_path: the envelope is unchanged
