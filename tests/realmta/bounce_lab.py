"""A second Postfix + Dovecot lab that bounces for real and serves the bounces over IMAP.

:class:`BounceLab` is tests/realmta/lab.py's :class:`Lab` (same certificates,
ports and private instances; lab.py is not changed) with:

* **Dovecot** serving IMAP as well as SASL: STARTTLS on ``imap``, TLS on
  ``imaps``, plaintext logins refused without TLS, one mailbox user
  ``bounces@lab.test`` whose Maildir is the one Postfix delivers the bounce
  address to;
* **Postfix** that accepts every ``lab.test`` recipient at RCPT TO
  (``smtpd_reject_unlisted_recipient = no``) and then, in its queue manager
  and delivery agents, produces real RFC 3464 DSNs:

  - an address missing from ``virtual_mailbox_maps``: "User unknown in virtual
    mailbox table", 5.1.1 (failed);
  - ``full@lab.test``: routed to the ``error`` transport with "5.2.2 Mailbox
    full" (a virtual(8) service with a small ``virtual_mailbox_limit`` would
    be the closer model, but virtual(8) panics when the limit is below the
    message size: "file size limit ... < message size");
  - ``slow@lab.test``: routed to the ``retry`` transport (error(8) that
    defers), with ``delay_warning_time = 1s``: a delay warning (Action
    delayed, 4.2.1);
  - ``bounces+<detail>@lab.test`` (``recipient_delimiter = +``) and
    ``ok@lab.test``: delivered to their Maildirs.
"""

from __future__ import annotations

import grp
import imaplib
import os
import pwd
import ssl
import time
from pathlib import Path

from lab import DOMAIN, PASSWORD, USER, Lab, free_port

BOUNCE_USER, BOUNCE_PASSWORD = f"bounces@{DOMAIN}", "bounce-password-1"


class BounceLab(Lab):
    @property
    def bounce_maildir(self) -> Path:
        return self.root / "mail" / "bounces"

    @property
    def ok_maildir(self) -> Path:
        return self.root / "mail" / "ok"

    def start(self) -> BounceLab:
        super().start()
        return self

    # Dovecot: SASL for Postfix (as lab.py) plus IMAP for the bounce mailbox.
    def _dovecot(self) -> None:
        # not in self.ports: Lab.start waits for an SMTP greeting on each of those
        self.imap_ports = {"imap": free_port(), "imaps": free_port()}
        d = self.root / "dovecot"
        for sub in ("run", "state"):
            (d / sub).mkdir(parents=True)
        pf = pwd.getpwnam("postfix")
        (d / "passwd").write_text(
            f"{USER}:{{PLAIN}}{PASSWORD}::::::\n"
            f"{BOUNCE_USER}:{{PLAIN}}{BOUNCE_PASSWORD}:{pf.pw_uid}:{pf.pw_gid}::{self.root / 'mail'}::"
            f"userdb_mail=maildir:{self.bounce_maildir}\n")
        os.chmod(d / "passwd", 0o640)
        os.chown(d / "passwd", 0, grp.getgrnam("dovecot").gr_gid)
        private = self.queue_dir / "private"
        private.mkdir(parents=True)
        os.chown(private, pf.pw_uid, 0)
        os.chmod(private, 0o700)
        self.dovecot_conf.write_text(f"""\
# mailq-db realmta bounce lab: Dovecot as Postfix's SASL server and the IMAP server of the bounce mailbox.
base_dir = {d}/run
state_dir = {d}/state
log_path = {d}/dovecot.log
protocols = imap
ssl = yes
ssl_cert = <{self.cert}
ssl_key = <{self.key}
shutdown_clients = yes
default_internal_user = dovecot
default_login_user = dovenull
first_valid_uid = 1
auth_mechanisms = plain login
auth_failure_delay = 0
disable_plaintext_auth = yes
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {d}/passwd
}}
userdb {{
  driver = passwd-file
  args = username_format=%u {d}/passwd
}}
service auth {{
  unix_listener {private}/auth {{
    mode = 0660
    user = postfix
    group = postfix
  }}
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.imap_ports['imap']}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {self.imap_ports['imaps']}
    ssl = yes
  }}
}}
service anvil {{
  chroot =
}}
""")
        self._start_dovecot(private)

    def _extra_main_cf(self) -> str:
        d = self.postfix_dir
        (d / "vmailbox").write_text(
            f"{BOUNCE_USER} bounces/\nok@{DOMAIN} ok/\nfull@{DOMAIN} full/\nslow@{DOMAIN} slow/\n")
        (d / "transport").write_text(
            f"full@{DOMAIN} error:5.2.2 Mailbox full: quota exceeded\n"
            f"slow@{DOMAIN} retry:4.2.1 mailbox temporarily unavailable\n")
        return f"""
# bounce lab (tests/realmta/bounce_lab.py): later entries win
virtual_mailbox_maps = texthash:{d}/vmailbox
transport_maps = texthash:{d}/transport
recipient_delimiter = +
smtpd_reject_unlisted_recipient = no
delay_warning_time = 1s
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 2s
"""

    # ------------------------------------------------------------ what tests read
    def maildir_files(self, maildir: Path) -> list[Path]:
        new = maildir / "new"
        return sorted(new.iterdir()) if new.exists() else []

    def wait_files(self, maildir: Path, count: int, timeout: float = 40.0) -> list[Path]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            files = self.maildir_files(maildir)
            if len(files) >= count:
                return files
            time.sleep(0.2)
        return self.maildir_files(maildir)

    def imap(self, *, starttls: bool = False) -> imaplib.IMAP4:
        """A logged-in IMAP session on the bounce mailbox (for tests to look)."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if starttls:
            conn: imaplib.IMAP4 = imaplib.IMAP4("127.0.0.1", self.imap_ports["imap"], timeout=10)
            conn.starttls(ssl_context=context)
        else:
            conn = imaplib.IMAP4_SSL("127.0.0.1", self.imap_ports["imaps"], ssl_context=context, timeout=10)
        conn.login(BOUNCE_USER, BOUNCE_PASSWORD)
        return conn
