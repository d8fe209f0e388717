"""A private Postfix + Dovecot lab on loopback, for the worker's real-MTA tests and benchmark.

:class:`Lab` writes a configuration directory, makes a CA and a server
certificate with ``openssl``, starts Dovecot (SASL only, passwd-file, an auth
socket in Postfix's private directory) and Postfix (``postfix -c DIR start``,
its own queue, data and log, chroot off, every service on a free loopback
port), and stops both in :meth:`Lab.stop`.  Nothing outside the directory is
written; nothing system-wide is started.

Ports (each a separate ``smtpd`` in master.cf):

* ``submission``: STARTTLS required, AUTH required (Dovecot), sender rules at
  MAIL FROM (``smtpd_delay_reject = no``), greylisting by a policy service for
  recipients whose local part starts with ``grey``, ``smtpd_recipient_limit``;
* ``mx``: STARTTLS offered, no AUTH, ``smtpd_delay_reject = yes`` (Postfix's
  default: HELO and sender rejections show at RCPT TO), HELO must be a FQDN;
* ``rate``: ``smtpd_client_message_rate_limit`` (anvil), no exception for
  loopback;
* ``connrate``: ``smtpd_client_connection_rate_limit`` (anvil);
* ``idle``: ``smtpd_timeout`` of IDLE_TIMEOUT_SECONDS, so a test can find a
  connection that the server closed while idle.

The policy service also refuses recipients whose local part starts with
``nouser`` (550 5.1.1), and, during a relay incident (:meth:`Lab.relay_incident`),
answers every message on the submission port with INCIDENT_REPLY at the end
of DATA (smtpd_end_of_data_restrictions).

The anvil time unit is shortened (``anvil_rate_time_unit``) so a rate test
takes seconds, not minutes; the limits are "per ``RATE_UNIT_SECONDS``".

Delivery: ``virtual(8)`` into one Maildir (``virtual_mailbox_maps =
static:inbox/``) for every address at ``lab.test``; each recipient gets its own
file, with ``Delivered-To:`` naming it.  ``maillog_file`` (Postfix 3.4+) keeps
the log, with queue IDs, in the directory.
"""

from __future__ import annotations

import email
import email.policy
import grp
import os
import pwd
import re
import shutil
import socket
import socketserver
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

DOMAIN = "lab.test"
USER, PASSWORD = "mailer@lab.test", "lab-password-1"
UTF8_USER, UTF8_PASSWORD = "utf8@lab.test", "pässwörd-€"  # RFC 4616: SASL PLAIN is UTF-8
RECIPIENT_LIMIT = 50
MESSAGE_SIZE_LIMIT = 200_000
MESSAGE_RATE_LIMIT = 5
CONNECTION_RATE_LIMIT = 2
RATE_UNIT_SECONDS = 12
IDLE_TIMEOUT_SECONDS = 2
#: senders refused at MAIL FROM on the submission port (access(5) map)
SENDER_RULES = {
    "tempfail-sender@lab.test": "451 4.3.0 Sender temporarily unavailable, try later",
    "refused-sender@lab.test": "553 5.7.1 Sender not allowed",
    "blocked-sender@lab.test": "REJECT",
    "pause-sender@lab.test": "450 4.1.8 <pause-sender@lab.test>: Sender address rejected: Domain not found",
}
#: What the policy service answers at the end of the message during a relay incident
#: (Lab.relay_incident): the reply a relay in trouble gives to every DATA.
INCIDENT_REPLY = "451 4.3.0 Temporary server error. Please try again later"


def in_ci() -> bool:
    """True on CI, where a missing lab package fails instead of skipping."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing() -> str | None:
    """Why the lab cannot run here, or None."""
    for tool in ("postfix", "postconf", "dovecot", "openssl"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} is not installed (apt-get install postfix dovecot-core openssl)"
    if os.geteuid() != 0:
        return "Postfix and Dovecot must be started as root (postfix -c DIR start); run as root"
    for user in ("postfix", "dovecot", "dovenull"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"system user {user} is missing (installed by the postfix/dovecot-core packages)"
    return None


_HANDED_OUT: set[int] = set()


def running_lab(factory, prefix: str, what: str = "the Postfix + Dovecot lab", reason: str | None = None):
    """A pytest fixture body: the lab ``factory(root)`` started in a fresh temporary
    directory, yielded, then stopped and removed.  Where it cannot run (``reason``, else
    :func:`missing`) the test is skipped with one reason, and fails in CI (``CI=true``),
    which must run it."""
    import pytest

    reason = reason or missing()
    if reason:
        message = f"{what} cannot run: {reason}"
        if in_ci():
            pytest.fail(message + " (CI=true: these tests must run in CI; .ci/run installs them)",
                        pytrace=False)
        pytest.skip(message)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    the_lab = factory(root)
    try:
        the_lab.start()
    except BaseException:
        the_lab.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield the_lab
    finally:
        the_lab.stop()
        shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    """A loopback port free now and never handed out before in this process: the
    kernel may give a just-released port again, and two services of one lab on one
    port (seen: the connection-rate and idle ports) make a test meet the wrong one."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class _Greylist(socketserver.ThreadingTCPServer):
    """A Postfix policy service (SMTPD_POLICY_README): the first RCPT of a
    (sender, recipient) pair whose local part starts with ``grey`` gets a 450."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()
        self.deferred: list[str] = []
        self.lock = threading.Lock()
        self.incident_until = 0.0  # time.monotonic() until which every message gets INCIDENT_REPLY
        self.incident_replies = 0
        super().__init__(("127.0.0.1", 0), _PolicyHandler)


def read_policy_request(rfile) -> dict[str, str] | None:
    """One Postfix policy delegation request (SMTPD_POLICY_README: name=value lines ended by
    an empty line), or None when Postfix closed the connection."""
    attrs: dict[str, str] = {}
    while True:
        line = rfile.readline()
        if not line:
            return None
        line = line.rstrip(b"\r\n")
        if not line:
            return attrs
        key, _, value = line.decode("utf-8", "replace").partition("=")
        attrs[key] = value


class _PolicyHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server: _Greylist = self.server  # type: ignore[assignment]
        while True:
            attrs = read_policy_request(self.rfile)
            if attrs is None:
                return
            action = "DUNNO"
            rcpt = attrs.get("recipient", "").lower()
            if attrs.get("protocol_state") == "END-OF-MESSAGE":
                with server.lock:
                    if time.monotonic() < server.incident_until:
                        server.incident_replies += 1
                        action = INCIDENT_REPLY
            elif attrs.get("protocol_state") == "RCPT" and rcpt.startswith("nouser"):
                action = "550 5.1.1 No such user here"
            elif attrs.get("protocol_state") == "RCPT" and rcpt.startswith("grey"):
                key = (attrs.get("sender", "").lower(), rcpt)
                with server.lock:
                    if key not in server.seen:
                        server.seen.add(key)
                        server.deferred.append(rcpt)
                        action = "450 4.2.0 Greylisted, please try again later"
            self.wfile.write(f"action={action}\n\n".encode())
            self.wfile.flush()


@dataclass
class Delivered:
    recipient: str
    raw: bytes
    path: Path

    @property
    def message(self) -> email.message.EmailMessage:
        return email.message_from_bytes(self.raw, policy=email.policy.default)  # type: ignore[return-value]


@dataclass
class Lab:
    root: Path
    ports: dict[str, int] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    #: the smtpd services (a subclass adds its own with _extra_services)
    PORTS = ("submission", "mx", "rate", "connrate", "idle")

    # ------------------------------------------------------------ paths
    @property
    def postfix_dir(self) -> Path:
        return self.root / "postfix"

    @property
    def queue_dir(self) -> Path:
        return self.root / "queue"

    @property
    def dovecot_conf(self) -> Path:
        return self.root / "dovecot" / "dovecot.conf"

    @property
    def ca_file(self) -> str:
        return str(self.root / "tls" / "ca.pem")

    @property
    def maildir(self) -> Path:
        return self.root / "mail" / "inbox"

    @property
    def log_file(self) -> Path:
        return self.root / "log" / "postfix.log"

    # ------------------------------------------------------------ setup
    def start(self) -> "Lab":
        # Postfix opens its lock files as mail_owner and delivers as the postfix
        # user: they must be able to reach the directory (mkdtemp makes it 0700).
        os.chmod(self.root, 0o755)
        for parent in self.root.parents:
            if not os.stat(parent).st_mode & 0o001:
                raise RuntimeError(f"{parent} is not searchable by other users: the postfix user "
                                   "cannot reach the lab directory; choose another base (TMPDIR)")
        for name in self.PORTS:
            self.ports[name] = free_port()
        self.policy = _Greylist()
        threading.Thread(target=self.policy.serve_forever, name="greylist", daemon=True).start()
        self._certificates()
        self._dovecot()
        self._postfix()
        for port in self.ports.values():
            self._wait_for_greeting(port)
        return self

    def _run(self, *args: str) -> str:
        """Run a command to completion; its output goes to a file, never to a pipe
        (Dovecot and Postfix leave daemons behind that would keep a pipe open)."""
        out = self.root / "commands.log"
        with open(out, "ab+") as fh:
            start = fh.tell()
            fh.write(f"$ {' '.join(args)}\n".encode())
            fh.flush()
            proc = subprocess.run(list(args), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=60)
            fh.seek(start)
            text = fh.read().decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{text}" + self._logs())
        return text

    def _logs(self) -> str:
        out = []
        for path in (self.log_file, self.root / "dovecot" / "dovecot.log"):
            if path.exists():
                out.append(f"\n--- {path} (last lines) ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        return "".join(out)

    def _certificates(self) -> None:
        d = self.root / "tls"
        d.mkdir(parents=True)
        ca_key, ca, key, csr, cert = (str(d / n) for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self._run("openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2",
                  "-subj", "/CN=mailq-db lab CA", "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        self._run("openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=localhost")
        ext = d / "server.ext"
        ext.write_text("subjectAltName=DNS:localhost,DNS:mx.lab.test,IP:127.0.0.1\n"
                       "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
        self._run("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                  "-out", cert, "-days", "2", "-extfile", str(ext))
        os.chmod(key, 0o600)
        self.cert, self.key = cert, key

    def _dovecot(self) -> None:
        d = self.root / "dovecot"
        for sub in ("run", "state"):
            (d / sub).mkdir(parents=True)
        (d / "passwd").write_text(f"{USER}:{{PLAIN}}{PASSWORD}::::::\n"
                                  f"{UTF8_USER}:{{PLAIN}}{UTF8_PASSWORD}::::::\n", encoding="utf-8")
        os.chmod(d / "passwd", 0o640)
        os.chown(d / "passwd", 0, grp.getgrnam("dovecot").gr_gid)
        # Postfix's private directory must exist before Dovecot makes the socket in it.
        private = self.queue_dir / "private"
        private.mkdir(parents=True)
        pf = pwd.getpwnam("postfix")
        os.chown(private, pf.pw_uid, 0)
        os.chmod(private, 0o700)
        self.dovecot_conf.write_text(f"""\
# mailq-db realmta lab: Dovecot as Postfix's SASL server only (no IMAP/POP3).
base_dir = {d}/run
state_dir = {d}/state
log_path = {d}/dovecot.log
protocols = none
ssl = no
shutdown_clients = yes
default_internal_user = dovecot
default_login_user = dovenull
auth_failure_delay = 0
disable_plaintext_auth = no
{self._dovecot_auth(d)}userdb {{
  driver = static
  args = uid=dovecot gid=dovecot home=/nonexistent
}}
service auth {{
  unix_listener {private}/auth {{
    mode = 0660
    user = postfix
    group = postfix
  }}
}}
service anvil {{
  chroot =
}}
""")
        self._start_dovecot(private)

    def _start_dovecot(self, private: Path) -> None:
        """Start Dovecot on dovecot_conf and wait for its auth socket in Postfix's private directory."""
        self._run("dovecot", "-c", str(self.dovecot_conf))
        self.started.append("dovecot")
        deadline = time.monotonic() + 20
        while not (private / "auth").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("Dovecot did not create its auth socket" + self._logs())
            time.sleep(0.05)

    def _dovecot_auth(self, d: Path) -> str:
        """The mechanisms and password databases of dovecot.conf (a subclass adds its own)."""
        return f"""auth_mechanisms = plain login
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {d}/passwd
}}
"""

    def _extra_services(self) -> str:
        """More master.cf services (a subclass's ports); none here."""
        return ""

    def _postfix(self) -> None:
        d = self.postfix_dir
        d.mkdir()
        data = self.root / "data"
        data.mkdir()
        (self.root / "log").mkdir()
        pf = pwd.getpwnam("postfix")
        os.chown(data, pf.pw_uid, pf.pw_gid)
        mail = self.root / "mail"
        mail.mkdir()
        os.chown(mail, pf.pw_uid, pf.pw_gid)
        (d / "sender_access").write_text(
            "".join(f"{addr} {action}\n" for addr, action in SENDER_RULES.items()))
        (d / "helo_access").write_text("")
        p = self.ports
        q = self.queue_dir
        (d / "main.cf").write_text(f"""\
# mailq-db realmta lab (written by tests/realmta/lab.py)
compatibility_level = 3.6
queue_directory = {q}
data_directory = {data}
mail_owner = postfix
setgid_group = postdrop
myhostname = mx.lab.test
mydomain = lab.test
myorigin = lab.test
mydestination =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
maillog_file = {self.log_file}
maillog_file_prefixes = {self.root}
smtputf8_enable = yes
biff = no
append_dot_mydomain = no
alias_maps =
alias_database =
local_recipient_maps =
relayhost =
default_transport = error:lab does not relay
virtual_mailbox_domains = {DOMAIN}
virtual_mailbox_base = {mail}
virtual_mailbox_maps = static:inbox/
virtual_uid_maps = static:{pf.pw_uid}
virtual_gid_maps = static:{pf.pw_gid}
virtual_minimum_uid = 1
message_size_limit = {MESSAGE_SIZE_LIMIT}
virtual_mailbox_limit = 0
smtpd_recipient_limit = {RECIPIENT_LIMIT}
smtpd_tls_cert_file = {self.cert}
smtpd_tls_key_file = {self.key}
smtpd_tls_security_level = may
smtpd_tls_loglevel = 0
smtp_tls_security_level = none
smtpd_sasl_type = dovecot
smtpd_sasl_path = private/auth
smtpd_sasl_auth_enable = no
smtpd_helo_required = yes
smtpd_relay_restrictions = permit_mynetworks, permit_sasl_authenticated, reject_unauth_destination
smtpd_recipient_restrictions =
anvil_rate_time_unit = {RATE_UNIT_SECONDS}s
smtpd_client_event_limit_exceptions = $mynetworks
smtpd_error_sleep_time = 0
smtpd_soft_error_limit = 1000
smtpd_hard_error_limit = 1000
smtpd_junk_command_limit = 1000
in_flow_delay = 0
delay_warning_time = 0
""")
        common = "-o syslog_name=postfix/{name}"
        (d / "master.cf").write_text(f"""\
# service type private unpriv chroot wakeup maxproc command
127.0.0.1:{p['submission']} inet n - n - - smtpd
  {common.format(name='submission')}
  -o smtpd_tls_security_level=encrypt
  -o smtpd_tls_auth_only=yes
  -o smtpd_sasl_auth_enable=yes
  -o smtpd_delay_reject=no
  -o smtpd_client_restrictions=
  -o smtpd_sender_restrictions=check_sender_access,texthash:{d}/sender_access
  -o smtpd_recipient_restrictions=check_policy_service,inet:127.0.0.1:{self.policy.server_address[1]},permit_sasl_authenticated,reject
  -o smtpd_end_of_data_restrictions=check_policy_service,inet:127.0.0.1:{self.policy.server_address[1]}
  -o smtpd_relay_restrictions=permit_sasl_authenticated,reject
127.0.0.1:{p['mx']} inet n - n - - smtpd
  {common.format(name='mx')}
  -o smtpd_delay_reject=yes
  -o smtpd_helo_restrictions=reject_non_fqdn_helo_hostname,reject_invalid_helo_hostname
  -o smtpd_sender_restrictions=check_sender_access,texthash:{d}/sender_access
  -o smtpd_recipient_restrictions=reject_unauth_destination
127.0.0.1:{p['rate']} inet n - n - - smtpd
  {common.format(name='rate')}
  -o smtpd_client_event_limit_exceptions=
  -o smtpd_client_message_rate_limit={MESSAGE_RATE_LIMIT}
127.0.0.1:{p['connrate']} inet n - n - - smtpd
  {common.format(name='connrate')}
  -o smtpd_client_event_limit_exceptions=
  -o smtpd_client_connection_rate_limit={CONNECTION_RATE_LIMIT}
127.0.0.1:{p['idle']} inet n - n - - smtpd
  {common.format(name='idle')}
  -o smtpd_timeout={IDLE_TIMEOUT_SECONDS}s
{self._extra_services()}pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
tlsmgr    unix  -       -       n       1000?   1       tlsmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
proxywrite unix -       -       n       -       1       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
local     unix  -       n       n       -       -       local
virtual   unix  -       n       n       -       -       virtual
lmtp      unix  -       -       n       -       -       lmtp
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
""")
        extra = self._extra_main_cf()
        if extra:
            with open(d / "main.cf", "a") as fh:
                fh.write(extra)
        self._run("postfix", "-c", str(d), "check")
        self._run("postfix", "-c", str(d), "start")
        self.started.append("postfix")

    def _extra_main_cf(self) -> str:
        """Lines a derived lab appends to main.cf before Postfix starts (later entries
        win), so that no test races a reload."""
        return ""

    def _wait_for_greeting(self, port: int) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    if s.recv(512).startswith(b"220"):
                        s.sendall(b"QUIT\r\n")
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Postfix did not answer on port {port}" + self._logs())
            time.sleep(0.1)

    def stop(self) -> None:
        errors = []
        if "postfix" in self.started:
            try:
                self._run("postfix", "-c", str(self.postfix_dir), "stop")
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                errors.append(str(exc))
            # Make sure the master is gone (its pid file is in the private queue directory).
            pidfile = self.queue_dir / "pid" / "master.pid"
            _wait_gone(pidfile)
        if "dovecot" in self.started:
            try:
                self._run("dovecot", "-c", str(self.dovecot_conf), "stop")
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                errors.append(str(exc))
            _wait_gone(self.root / "dovecot" / "run" / "master.pid")
        if getattr(self, "policy", None) is not None:
            self.policy.shutdown()
            self.policy.server_close()
        self.started.clear()
        if errors:
            raise RuntimeError("stopping the lab: " + "; ".join(errors))

    def relay_incident(self, seconds: float) -> None:
        """For ``seconds`` from now, the submission port answers every message
        with INCIDENT_REPLY after its final dot (a relay's bad minutes)."""
        with self.policy.lock:
            self.policy.incident_until = time.monotonic() + seconds

    def wait_queue_empty(self, timeout: float = 30.0) -> None:
        """Until Postfix has delivered (or bounced) everything it accepted."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(["postqueue", "-c", str(self.postfix_dir), "-j"], capture_output=True,
                                 text=True, timeout=30).stdout
            if not out.strip():
                return
            time.sleep(0.1)
        raise RuntimeError("Postfix's queue did not empty" + self._logs())

    def copies(self, message_id: str) -> dict[str, int]:
        """How many copies of the message with ``message_id`` each recipient received."""
        out: dict[str, int] = {}
        for d in self.delivered():
            m = re.search(rb"^Message-ID:\s*(\S+)\r?$", d.raw, re.MULTILINE | re.IGNORECASE)
            if m and m.group(1).decode() == message_id:
                out[d.recipient] = out.get(d.recipient, 0) + 1
        return out

    # ------------------------------------------------------------ what tests read
    def delivered(self) -> list[Delivered]:
        out = []
        new = self.maildir / "new"
        if not new.exists():
            return out
        for path in sorted(new.iterdir(), key=lambda p: p.name):
            raw = path.read_bytes()
            m = re.search(rb"^Delivered-To: (\S+)\r?$", raw, re.MULTILINE)
            out.append(Delivered(m.group(1).decode() if m else "", raw, path))
        return out

    def delivered_to(self, prefix: str) -> list[Delivered]:
        """Messages delivered to recipients whose address starts with ``prefix``."""
        return [d for d in self.delivered() if d.recipient.startswith(prefix)]

    def wait_delivered(self, prefix: str, count: int, timeout: float = 30.0) -> list[Delivered]:
        """Wait until ``count`` messages reached ``prefix``*; returns what arrived (maybe fewer)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.delivered_to(prefix)
            if len(got) >= count:
                return got
            time.sleep(0.1)
        return self.delivered_to(prefix)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""


def _wait_gone(pidfile: Path, timeout: float = 20.0) -> None:
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        pass
