"""``mailq-db check-config --probe`` against the lab's Postfix + Dovecot."""

from __future__ import annotations

import textwrap

from lab import PASSWORD, USER
from realmta_helpers import account

from mailq_db.cli import main
from mailq_db.worker.probe import probe


def write_config(tmp_path, lab, **overrides):
    values = dict(host="127.0.0.1", port=lab.ports["submission"], tls="starttls", user=USER,
                  password_env="LAB_SMTP_PASSWORD", ca_file=lab.ca_file, local_hostname="worker.lab.test")
    values.update(overrides)
    body = "\n".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {str(v).lower()}"
                     for k, v in values.items())
    path = tmp_path / "worker.toml"
    path.write_text(textwrap.dedent("[worker]\nbatch_size = 10\n\n[accounts.lab]\n") + body.replace("'", '"') + "\n")
    return str(path)


def test_probe_reports_every_step_and_quits(lab, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LAB_SMTP_PASSWORD", PASSWORD)
    main(["check-config", "--config", write_config(tmp_path, lab), "--probe", "--db", "mssql://h/d"])
    out = capsys.readouterr().out
    assert "certificate verified for localhost" in out
    for step in ("TCP 127.0.0.1", "EHLO: 250", "STARTTLS: TLSv1", "EHLO after STARTTLS",
                 "AUTH: logged in as mailer@lab.test (one attempt)", "QUIT: 221"):
        assert f"account lab / {step}" in out, (step, out)
    assert "[FAIL]" not in out


def test_probe_wrong_password_says_what_to_fix_and_still_quits(lab, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LAB_SMTP_PASSWORD", "wrong")
    code = main(["check-config", "--config", write_config(tmp_path, lab), "--probe", "--db", "mssql://h/d"])
    out = capsys.readouterr().out
    assert code == 1
    assert "[FAIL] account lab / AUTH: 535" in out and "authentication failed for account lab" in out
    assert "account lab / QUIT: 221" in out


def test_probe_untrusted_certificate(lab):
    steps, ok = probe({"lab": account(lab, ca_file=None)})  # the system CAs do not know the lab's CA
    assert not ok
    [tls] = [s for s in steps if s.name == "STARTTLS"]
    assert not tls.ok and "ca_file" in tls.fix and "certificate verify failed" in tls.detail


def test_probe_implicit_tls_on_a_starttls_port(lab):
    steps, ok = probe({"lab": account(lab, tls="implicit")})
    assert not ok
    assert 'tls = "starttls"' in steps[-1].fix or any('tls = "starttls"' in (s.fix or "") for s in steps)
