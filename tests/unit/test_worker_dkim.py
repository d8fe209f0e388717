"""DKIM signing of the worker's messages (issue 26).

Every signature is checked by two verifiers that are not the signing code:
OpenDKIM (Debian's ``opendkim``, in its test mode ``-t`` with the public key
read from a file by ``TestPublicKeys``, so no DNS is needed) and dkimpy's own
verifier given a DNS stub.  The end-to-end check through Postfix with
OpenDKIM as a milter is in tests/realmta/test_oauth_postfix.py.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import dkim as dkimpy
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from worker_helpers import FakeQueue, SmtpSink, account_for, make_mail, make_worker

from mailq_db.errors import ConfigurationError
from mailq_db.worker import dkim
from mailq_db.worker.config import parse_config
from mailq_db.worker.message import MalformedMail, build

LIST_UNSUBSCRIBE = "<https://unsubscribe.example.com/u/0123456789abcdef>, <mailto:unsub+0123@example.com>"


def new_key(bits: int = 2048) -> tuple[bytes, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                            serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem, "v=DKIM1; k=rsa; p=" + base64.b64encode(public).decode()


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> tuple[Path, str, bytes]:
    pem, txt = new_key()
    path = tmp_path_factory.mktemp("dkim") / "dkim.key"
    path.write_bytes(pem)
    path.chmod(0o600)
    return path, txt, pem


def settings_for(path: Path, **extra: Any) -> dkim.DkimSettings:
    table = "\n".join(f'{k} = "{v}"' for k, v in {"domain": "example.com", "selector": "mq2026",
                                                   "private_key_file": str(path), **extra}.items())
    text = f'[accounts.a]\nhost = "smtp.example.com"\n[accounts.a.dkim]\n{table}\n'
    return parse_config(text, env={}).accounts["a"].dkim


def dns_stub(txt: str, name: bytes = b"mq2026._domainkey.example.com.") -> Any:
    def lookup(query: bytes, timeout: int = 5) -> bytes | None:
        return txt.encode() if query == name else None
    return lookup


def message(**fields: Any) -> bytes:
    values: dict[str, Any] = dict(from_address="sender@example.com", from_name="Zhang 张三",
                                  subject="Grüße, a subject long enough to be folded by the policy " * 2,
                                  headers={"List-Unsubscribe": LIST_UNSUBSCRIBE,
                                           "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"})
    values.update(fields)
    return build(make_mail(1, **values)).data


def signed_fields(signed: bytes) -> list[str]:
    header = signed.split(b"\r\n\r\n", 1)[0].decode()
    h = re.search(r"\bh=([^;]+)", re.sub(r"\s+", "", header.split("DKIM-Signature:", 1)[1])).group(1)
    return h.lower().split(":")


def test_the_signature_covers_the_present_headers_relaxed_relaxed(key):
    path, txt, _ = key
    signed = dkim.sign(settings_for(path), message())
    assert signed.startswith(b"DKIM-Signature: ")
    header = re.sub(r"\s+", "", signed.split(b"\r\n\r\n", 1)[0].decode().split("DKIM-Signature:", 1)[1])
    assert "c=relaxed/relaxed" in header and "d=example.com" in header and "s=mq2026" in header
    assert "a=rsa-sha256" in header
    assert set(signed_fields(signed)) == {"from", "to", "subject", "date", "message-id", "mime-version",
                                          "content-type", "list-unsubscribe", "list-unsubscribe-post"}
    assert dkimpy.verify(signed, dnsfunc=dns_stub(txt))


def test_absent_headers_are_not_signed_and_cc_is_when_present(key):
    path, txt, _ = key
    plain = dkim.sign(settings_for(path), message(headers={}))
    assert "list-unsubscribe" not in signed_fields(plain) and "cc" not in signed_fields(plain)
    with_cc = dkim.sign(settings_for(path), message(cc="copy@example.org", reply_to="desk@example.com"))
    assert {"cc", "reply-to"} <= set(signed_fields(with_cc))
    assert dkimpy.verify(plain, dnsfunc=dns_stub(txt)) and dkimpy.verify(with_cc, dnsfunc=dns_stub(txt))


def test_dkimpy_rejects_a_changed_body_or_a_changed_signed_header(key):
    path, txt, _ = key
    signed = dkim.sign(settings_for(path), message())
    head, body = signed.split(b"\r\n\r\n", 1)
    assert not dkimpy.verify(head + b"\r\n\r\n" + body.replace(b"body", b"BODY", 1), dnsfunc=dns_stub(txt))
    assert not dkimpy.verify(signed.replace(b"List-Unsubscribe-Post: List-Unsubscribe=One-Click",
                                            b"List-Unsubscribe-Post: List-Unsubscribe=Two-Clicks"),
                             dnsfunc=dns_stub(txt))


def test_relaxed_canonicalization_survives_a_relay_refolding_headers(key):
    path, txt, _ = key
    signed = dkim.sign(settings_for(path), message())
    refolded = re.sub(rb"\r\n ", b"\r\n\t  ", signed.split(b"\r\n\r\n", 1)[0]) + b"\r\n\r\n" + \
        signed.split(b"\r\n\r\n", 1)[1]
    assert refolded != signed and dkimpy.verify(refolded, dnsfunc=dns_stub(txt))


def opendkim(raw: bytes, txt: str, directory: Path) -> str:
    if shutil.which("opendkim") is None and not os.path.exists("/usr/sbin/opendkim"):
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("opendkim is not installed (.ci/run installs it): the independent verifier must run in CI")
        pytest.skip("opendkim is not installed (apt-get install opendkim)")
    (directory / "keys").write_text(f"mq2026._domainkey.example.com {txt}\n")
    (directory / "verify.conf").write_text(f"Mode v\nSyslog no\nTestPublicKeys {directory / 'keys'}\n")
    (directory / "m.eml").write_bytes(raw)
    out = subprocess.run([shutil.which("opendkim") or "/usr/sbin/opendkim", "-x", str(directory / "verify.conf"),
                          "-t", str(directory / "m.eml")], capture_output=True, text=True, timeout=30)
    return out.stdout + out.stderr


def test_opendkim_verifies_the_signature_and_refuses_a_tampered_copy(key, tmp_path):
    path, txt, _ = key
    signed = dkim.sign(settings_for(path), message())
    assert "verification (s=mq2026, d=example.com, 2048-bit key) succeeded" in opendkim(signed, txt, tmp_path)
    tampered = signed.replace(b"Subject: ", b"Subject: Re: ", 1)
    assert "failed" in opendkim(tampered, txt, tmp_path)


def test_the_key_may_come_from_the_environment(key):
    path, txt, pem = key
    text = ('[accounts.a]\nhost = "smtp.example.com"\n[accounts.a.dkim]\ndomain = "example.com"\n'
            'selector = "mq2026"\nprivate_key_env = "DKIM_KEY"\n')
    settings = parse_config(text, env={"DKIM_KEY": pem.decode()}).accounts["a"].dkim
    assert settings.key_source == "$DKIM_KEY" and settings.key_bits == 2048
    assert "BEGIN" not in repr(settings)
    assert dkimpy.verify(dkim.sign(settings, message()), dnsfunc=dns_stub(txt))


def test_a_key_saved_with_crlf_or_escaped_on_one_line_is_accepted(key, tmp_path):
    path, txt, pem = key
    crlf = tmp_path / "windows.key"
    crlf.write_bytes(pem.replace(b"\n", b"\r\n"))  # before: "not an RSA private key in PEM"
    assert dkimpy.verify(dkim.sign(settings_for(crlf), message()), dnsfunc=dns_stub(txt))
    text = ('[accounts.a]\nhost = "smtp.example.com"\n[accounts.a.dkim]\ndomain = "example.com"\n'
            'selector = "mq2026"\nprivate_key_env = "DKIM_KEY"\n')
    one_line = pem.decode().strip().replace("\n", "\\n")  # as an env file holds it
    settings = parse_config(text, env={"DKIM_KEY": one_line}).accounts["a"].dkim
    assert dkimpy.verify(dkim.sign(settings, message()), dnsfunc=dns_stub(txt))


def test_check_config_warns_about_a_key_file_other_users_can_read(key, tmp_path, capsys):
    from mailq_db.cli import main

    path, _, pem = key
    open_key = tmp_path / "open.key"
    open_key.write_bytes(pem)
    open_key.chmod(0o644)
    refresh = tmp_path / "sales.rt"
    refresh.write_text("rt-one")
    refresh.chmod(0o664)
    config = tmp_path / "worker.toml"
    config.write_text(f"""
[accounts.signed]
host = "smtp.example.com"
[accounts.signed.dkim]
domain = "example.com"
selector = "mq2026"
private_key_file = "{open_key}"

[accounts.safe]
host = "smtp.example.com"
[accounts.safe.dkim]
domain = "example.com"
selector = "mq2026"
private_key_file = "{path}"

[accounts.delegated]
host = "smtp.example.com"
user = "sales@example.com"
auth = "xoauth2"
[accounts.delegated.oauth]
provider = "refresh_token"
issuer = "microsoft"
tenant = "organizations"
client_id = "cid"
refresh_token_file = "{refresh}"
""")
    main(["worker", "--config", str(config), "--check-config"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "can be read or changed" in line]
    assert warnings == [
        f"warning: account signed: {open_key} (the DKIM private key) can be read or changed by every user of this "
        f"machine (mode 0644): chmod 600 {open_key} (or 640 with a group of the worker's user only)",
        f"warning: account delegated: {refresh} (the refresh token) can be read or changed by every user of this "
        f"machine (mode 0664): chmod 600 {refresh} (or 640 with a group of the worker's user only)"]
    assert pem.decode().splitlines()[1] not in capsys.readouterr().err


@pytest.mark.parametrize("table,problem", [
    ('domain = "example.com"\nselector = "s"', "private key is required"),
    ('domain = "example"\nselector = "s"\nprivate_key_file = "KEY"', "signing domain"),
    ('domain = "example.com"\nselector = "a b"\nprivate_key_file = "KEY"', "DNS label"),
    ('domain = "example.com"\nselector = "s"\nprivate_key_file = "/no/such/key"', "cannot read /no/such/key"),
    ('domain = "example.com"\nselector = "s"\nprivate_key_file = "KEY"\nheaders = ["To", "Subject"]',
     "must include From"),
    ('domain = "example.com"\nselector = "s"\nprivate_key_file = "KEY"\nalgorithm = "ed25519"', "unknown setting"),
    ('domain = "example.com"\nselector = "s"\nprivate_key_file = "SMALL"', "512-bit key"),
    ('domain = "example.com"\nselector = "s"\nprivate_key_file = "JUNK"', "not an RSA private key"),
])
def test_dkim_settings_problems_say_what_to_do(key, tmp_path, table, problem):
    small = tmp_path / "small.key"
    if "SMALL" in table:  # cryptography refuses to make one; openssl still does
        subprocess.run(["openssl", "genrsa", "-out", str(small), "512"], check=True, capture_output=True)
    junk = tmp_path / "junk.key"
    junk.write_text("-----BEGIN RSA PRIVATE KEY-----\nbm90IGEga2V5\n-----END RSA PRIVATE KEY-----\n")
    table = table.replace("KEY", str(key[0])).replace("SMALL", str(small)).replace("JUNK", str(junk))
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        parse_config(f'[accounts.a]\nhost = "smtp.example.com"\n[accounts.a.dkim]\n{table}\n', env={})


def test_the_worker_signs_what_it_sends(key, cert_dir):
    path, txt, _ = key
    with SmtpSink() as sink:
        acct = account_for(sink)
        acct = type(acct)(**{**acct.__dict__, "dkim": settings_for(path)})
        queue = FakeQueue([make_mail(1, headers={"List-Unsubscribe": LIST_UNSUBSCRIBE})])
        make_worker(queue, {"default": acct}).run(once=True)
        assert queue.status(1) == "Sent"
        [received] = sink.messages
    assert received.data.startswith(b"DKIM-Signature:")
    assert dkimpy.verify(received.data.replace(b"\n", b"\r\n").replace(b"\r\r\n", b"\r\n"), dnsfunc=dns_stub(txt))


def test_an_application_may_not_set_its_own_dkim_signature():
    with pytest.raises(MalformedMail, match="may not be set by the application"):
        build(make_mail(1, headers={"DKIM-Signature": "v=1; a=rsa-sha256; d=evil.example; s=x; b=AAAA"}))
