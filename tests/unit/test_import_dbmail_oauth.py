"""``mailq-db import-dbmail``: accounts on Microsoft 365, Outlook.com and Gmail get a
commented OAuth 2.0 template instead of a password placeholder (issue 26).

The skeleton must stay valid TOML, be refused by the worker's configuration
check as long as the template is not filled in (so nobody starts a worker
that can only fail), and be accepted once it is.
"""

from __future__ import annotations

import re

import pytest

from mailq_db.commands import import_dbmail as imp
from mailq_db.errors import ConfigurationError
from mailq_db.worker.config import parse_config


def skeleton(host: str, user: str = "sales@contoso.com", port: int = 587) -> str:
    account = imp.Account(1, "Sales", None, user, None, None,
                          imp.Server(host, port, user, False, True))
    return imp.worker_config_skeleton(imp.DbMailConfig([account], []))


def section(text: str) -> str:
    """The account's part of the skeleton."""
    return text[text.index("[accounts."):]


def uncomment_oauth(text: str, **values: str) -> str:
    """What an operator does: remove the "# " of the template's table, set the values."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("# [accounts.") and line.endswith(".oauth]"):
            inside = True
        if inside and line.startswith("# ") and ("=" in line or line.startswith("# [")):
            line = line[2:]
            key = line.split("=", 1)[0].strip()
            if key in values:
                line = f'{key} = "{values[key]}"'
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("host", ["smtp.office365.com", "outlook.office365.com", "SMTP.Office365.com"])
def test_microsoft_365_accounts_get_a_client_credentials_template(host):
    text = skeleton(host)
    assert "password_env" not in section(text)
    assert 'auth = "xoauth2"' in text and '# provider = "microsoft"' in text
    assert "550 5.7.30" in text and "SMTP.SendAsApp" in text
    assert '# client_secret_env = "MAILQ_SMTP_SALES_CLIENT_SECRET"' in text
    with pytest.raises(ConfigurationError, match=r'auth = "xoauth2" needs a table \[accounts\.Sales\.oauth\]'):
        parse_config(text, env={})
    filled = uncomment_oauth(text, tenant="contoso.onmicrosoft.com",
                             client_id="11111111-2222-3333-4444-555555555555")
    with pytest.raises(ConfigurationError, match="MAILQ_SMTP_SALES_CLIENT_SECRET is not set"):
        parse_config(filled, env={})
    config = parse_config(filled, env={"MAILQ_SMTP_SALES_CLIENT_SECRET": "s"})
    acct = config.accounts["Sales"]
    assert acct.auth == "xoauth2" and acct.oauth.provider == "microsoft"
    assert acct.oauth.scopes == ("https://outlook.office365.com/.default",) and acct.user == "sales@contoso.com"


def test_gmail_workspace_accounts_get_a_service_account_template(tmp_path):
    text = skeleton("smtp.gmail.com", user="sales@example.com")
    assert "password_env" not in section(text) and '# provider = "google"' in text
    assert "30 September 2024" in text and "https://mail.google.com/" in text
    key = tmp_path / "sa.json"
    key.write_text("{}")
    config = parse_config(uncomment_oauth(text, service_account_file=str(key)), env={})
    assert config.accounts["Sales"].oauth.subject == "sales@example.com"


@pytest.mark.parametrize("host,user,issuer", [("smtp.gmail.com", "someone@gmail.com", "google"),
                                              ("smtp-mail.outlook.com", "someone@outlook.com", "microsoft")])
def test_consumer_mailboxes_get_a_refresh_token_template(host, user, issuer):
    text = skeleton(host, user=user)
    assert '# provider = "refresh_token"' in text and f'# issuer = "{issuer}"' in text
    assert "password_env" not in section(text)
    with pytest.raises(ConfigurationError):
        parse_config(text, env={})


def test_other_hosts_keep_the_password_placeholder():
    text = skeleton("smtp.example.com")
    assert re.search(r'password_env = "MAILQ_SMTP_SALES_PASSWORD"', text) and "auth =" not in text
