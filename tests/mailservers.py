"""Real mail servers for the tests: a throwaway Postfix and Dovecot (Debian's packages, see
tests/sysdeps.sh), started the way tests/helpers.py starts the throwaway PostgreSQL.

- Postfix listens on a free loopback port for *submission*: STARTTLS required before anything
  else, then SASL login (PLAIN or LOGIN) checked by Dovecot's auth service over a Unix socket.
  It accepts mail for the users of ``MAIL_DOMAIN``, and delivers it to Dovecot by LMTP
  (a Unix socket); it sends nothing anywhere else (every other destination is an error) but
  to the routes of `MailServers.route`.
- Postfix also listens on a free loopback port for plain SMTP (``plain_port``): no TLS, no
  login, for loopback clients only (``mynetworks``), as a server's relay for its replies
  (another stampd's ``STAMPD_MAIL_RELAY``).
- `MailServers.route` (before `start`) makes Postfix relay one more domain by SMTP to a given
  host and port (``relay_domains``, ``transport_maps``): another stampd's mail listener, whose
  address is in that domain.
- Dovecot serves IMAP on a free loopback port: STARTTLS required before login, IDLE, the
  users of a passwd-file with plain passwords, their Maildirs under the temporary directory.
- TLS certificates come from a throwaway CA made here with ``cryptography`` (`TestCA`); a
  client trusts ``ca_file`` and nothing else.

Everything (configuration, queue, mailboxes, sockets, logs) lies under one temporary directory;
the system's own mail configuration, ports 25/587/143 and services are never used or touched.
Both master processes are our direct children (run as root, as Postfix and Dovecot require, with
their daemons under the ``postfix``/``dovecot`` users and the mailboxes owned by ``nobody``), and
are stopped by PID. Missing programs fail the test, never skip it.

`Responder` is an email timestamper on the other side: it reads the requests in a user's
mailbox and answers each with a ``gpg --clearsign`` reply (real gpg, a committed test key).
"""

from __future__ import annotations

import contextlib
import datetime
import grp
import imaplib
import ipaddress
import os
import pwd
import secrets
import shutil
import smtplib
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path

from procs.forked import stop_child
from tests.helpers import DATA, free_port, short_tmpdir

MAIL_DOMAIN = "mail.test"
POSTFIX_DIRS = (  # the queue's directories, as postfix-files makes them
    ("active", 0o700), ("bounce", 0o700), ("corrupt", 0o700), ("defer", 0o700),
    ("deferred", 0o700), ("flush", 0o700), ("hold", 0o700), ("incoming", 0o700),
    ("private", 0o700), ("saved", 0o700), ("trace", 0o700))
POSTFIX_MASTER = Path("/usr/lib/postfix/sbin/master")
DOVECOT = Path("/usr/sbin/dovecot")
MAILBOX_OWNER = "nobody"
STAMPER_KEY = DATA / "keys" / "ed25519"  # the timestamper's key (.sec.asc, .pub.asc, .fpr)
IMPOSTOR_KEY = DATA / "keys" / "nistp256"  # another key, for a reply signed by the wrong one


class MailServerError(RuntimeError):
    pass


def missing_programs() -> list[str]:
    """The Debian packages whose programs are missing (tests/sysdeps.sh installs them)."""
    need = {POSTFIX_MASTER: "postfix", DOVECOT: "dovecot-core",
            Path("/usr/lib/dovecot/imap"): "dovecot-imapd",
            Path("/usr/lib/dovecot/lmtp"): "dovecot-lmtpd"}
    return [pkg for path, pkg in need.items() if not path.exists()]


# ---------------------------------------------------------------------------------------------
# A throwaway certificate authority


@dataclass
class TestCA:
    """A CA key and certificate, and server certificates it issues for loopback names."""

    dir: Path
    ca_file: Path = field(init=False)

    def __post_init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stampd test CA")])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256()))
        self.ca_file = self.dir / "ca.pem"
        self.ca_file.write_bytes(self._pem(self._cert))

    @staticmethod
    def _pem(obj: object) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding

        return obj.public_bytes(Encoding.PEM)  # type: ignore[attr-defined, no-any-return]

    def issue(self, stem: str, address: str) -> tuple[Path, Path]:
        """(certificate file, key file) for the IP ``address`` (and ``localhost``), signed by
        the CA."""
        hostname = "localhost"
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)]))
            .issuer_name(self._cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName(hostname), x509.IPAddress(ipaddress.ip_address(address))]),
                critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256()))
        cert_file, key_file = self.dir / f"{stem}.pem", self.dir / f"{stem}.key"
        cert_file.write_bytes(self._pem(cert) + self._pem(self._cert))
        key_file.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        os.chmod(key_file, 0o600)
        return cert_file, key_file

    def client_context(self) -> ssl.SSLContext:
        """A client's TLS context that trusts this CA alone (and checks the host name)."""
        return ssl.create_default_context(cafile=str(self.ca_file))


# ---------------------------------------------------------------------------------------------
# The two servers


@dataclass(frozen=True)
class MailUser:
    address: str
    password: str


def _write_settled(path: Path, text: str) -> None:
    """Write a file Postfix reads (main.cf, a texthash map), its modification time set 10 s
    back: Postfix re-reads a file changed less than 2 s before it began reading (one that
    may still be being written), every 0.3 s until it is that old, so a fresh main.cf held
    up each start of the master ~2 s, and a fresh map the first mail ~2 s more."""
    path.write_text(text)
    settled = time.time() - 10
    os.utime(path, (settled, settled))


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes], what: str, log: Path,
               timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s, contextlib.suppress(OSError):
            s.settimeout(1)
            s.connect((host, port))
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise MailServerError(f"{what} did not start (exit {proc.poll()}):\n{tail}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    """A master by PID (`procs.forked.stop_child`: SIGTERM, SIGKILL after 20 s)."""
    if proc is not None:
        stop_child(proc, 20)


class MailServers:
    """A Postfix (submission) and a Dovecot (IMAP, LMTP, SASL auth) of their own.

    ``add_user`` before ``start`` (or ``restart_dovecot`` after); ``smtp_port`` and
    ``imap_port`` are loopback ports; ``host`` is the name in the certificates."""

    # A loopback address of their own: the client's address (127.0.0.1, the kernel's choice
    # for any 127/8 destination) then differs from the server's, so Dovecot does not take the
    # connection for a local, secured one (it would allow login without STARTTLS).
    host = "127.0.0.2"

    def __init__(self, users: list[str] | None = None, *, idle: bool = True) -> None:
        if os.geteuid() != 0:
            raise MailServerError("the throwaway Postfix and Dovecot need root (as the "
                                  "throwaway PostgreSQL runs as the postgres user)")
        missing = missing_programs()
        if missing:
            raise MailServerError("Postfix and Dovecot are required for these tests: "
                                  f"apt-get install -y {' '.join(missing)} (tests/sysdeps.sh)")
        # Short (Unix sockets live here), readable by the daemons' users.
        self.dir = Path(tempfile.mkdtemp(prefix="stampd-mail-", dir="/tmp"))
        os.chmod(self.dir, 0o755)
        self.ca = TestCA(self.dir)
        self.cert_file, self.key_file = self.ca.issue("server", self.host)
        self.smtp_port = free_port(self.host)
        self.plain_port = free_port(self.host)  # plain SMTP, no login, loopback clients
        self.imap_port = free_port(self.host)
        self.routes: dict[str, tuple[str, int]] = {}  # domain -> (host, port), by SMTP
        self.users: dict[str, MailUser] = {}
        self.idle = idle  # False: a server that offers no IDLE (clients poll)
        self.postfix: subprocess.Popen[bytes] | None = None
        self.dovecot: subprocess.Popen[bytes] | None = None
        for name in users or []:
            self.add_user(name)

    # -- users ---------------------------------------------------------------------------------
    def add_user(self, local: str, password: str | None = None) -> MailUser:
        user = MailUser(f"{local}@{MAIL_DOMAIN}", password or secrets.token_urlsafe(12))
        self.users[user.address] = user
        self._write_users()
        return user

    def _write_users(self) -> None:
        owner = pwd.getpwnam(MAILBOX_OWNER)
        mail = self.dir / "mail"
        mail.mkdir(exist_ok=True)
        os.chown(mail, owner.pw_uid, owner.pw_gid)
        lines, vmail = [], []
        for u in self.users.values():
            lines.append(f"{u.address}:{{PLAIN}}{u.password}:{owner.pw_uid}:{owner.pw_gid}::"
                         f"{mail / u.address}::\n")
            vmail.append(f"{u.address} ok\n")
        users = self.dir / "dovecot" / "users"
        users.parent.mkdir(exist_ok=True)
        users.write_text("".join(lines))
        os.chmod(users, 0o640)
        os.chown(users, 0, grp.getgrnam("dovecot").gr_gid)
        (self.dir / "postfix" / "conf").mkdir(parents=True, exist_ok=True)
        _write_settled(self.dir / "postfix" / "conf" / "vmailbox", "".join(vmail))

    def route(self, domain: str, host: str, port: int) -> None:
        """Relay mail for ``domain`` by SMTP to ``host``:``port`` (no MX look-up, no TLS);
        before `start` (or `start_postfix`)."""
        self.routes[domain] = (host, port)

    # -- start and stop ------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self._start_dovecot()
            self._start_postfix()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Both masters, by PID (each stops its own daemons), then the directory."""
        _stop(self.postfix)
        _stop(self.dovecot)
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in (self.postfix, self.dovecot) if p is not None]

    def stop_postfix(self) -> None:
        """Submission down (a test of a mail server that is down); `start_postfix` again."""
        _stop(self.postfix)
        self.postfix = None

    def start_postfix(self) -> None:
        self._start_postfix()

    def stop_dovecot(self) -> None:
        _stop(self.dovecot)
        self.dovecot = None

    def start_dovecot(self) -> None:
        self._start_dovecot()

    # -- Dovecot -------------------------------------------------------------------------------
    def _dovecot_conf(self) -> str:
        d = self.dir / "dovecot"
        return f"""\
protocols = imap lmtp
listen = {self.host}
base_dir = {d}/run
state_dir = {d}/state
instance_name = stampd-test-{self.imap_port}
log_path = {d}/dovecot.log
info_log_path = {d}/dovecot.log
ssl = required
ssl_cert = <{self.cert_file}
ssl_key = <{self.key_file}
disable_plaintext_auth = yes
auth_mechanisms = plain login
mail_location = maildir:~/Maildir
first_valid_uid = 1
mail_fsync = never
auth_failure_delay = 0
{"" if self.idle else "imap_capability = IMAP4rev1 SASL-IR LOGIN-REFERRALS ID ENABLE LITERAL+"}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN {d}/users
}}
userdb {{
  driver = passwd-file
  args = {d}/users
}}
service imap-login {{
  inet_listener imap {{
    address = {self.host}
    port = {self.imap_port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service lmtp {{
  unix_listener {d}/lmtp {{
    mode = 0666
  }}
}}
service auth {{
  unix_listener {d}/auth {{
    mode = 0666
  }}
}}
service anvil {{
  unix_listener anvil-auth-penalty {{
    mode = 0
  }}
}}
service stats {{
  unix_listener stats-writer {{
    mode = 0666
  }}
}}
"""

    def _start_dovecot(self) -> None:
        d = self.dir / "dovecot"
        for sub in ("run", "state"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        conf = d / "dovecot.conf"
        conf.write_text(self._dovecot_conf())
        log = d / "dovecot.log"
        self.dovecot = subprocess.Popen(
            [str(DOVECOT), "-F", "-c", str(conf)], stdin=subprocess.DEVNULL,
            start_new_session=True,
            stdout=open(d / "stdout.log", "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115
        _wait_port(self.host, self.imap_port, self.dovecot, "Dovecot", log)
        deadline = time.monotonic() + 30
        while not ((d / "auth").exists() and (d / "lmtp").exists()):
            if time.monotonic() > deadline:
                raise MailServerError("Dovecot made no auth and lmtp sockets")
            time.sleep(0.05)

    # -- Postfix -------------------------------------------------------------------------------
    def _postfix_main(self) -> str:
        p, d = self.dir / "postfix", self.dir / "dovecot"
        return f"""\
compatibility_level = 3.6
queue_directory = {p}/queue
data_directory = {p}/data
mail_owner = postfix
setgid_group = postdrop
myhostname = mx.{MAIL_DOMAIN}
mydomain = {MAIL_DOMAIN}
myorigin = $myhostname
mydestination =
mynetworks = 127.0.0.0/8
inet_interfaces = loopback-only
inet_protocols = ipv4
local_recipient_maps =
local_transport = error:no local delivery
alias_maps =
alias_database =
relay_domains = {", ".join(self.routes)}
transport_maps = {f"texthash:{p}/conf/transport" if self.routes else ""}
relayhost =
default_transport = error:the test mail server delivers to {MAIL_DOMAIN} only
virtual_mailbox_domains = {MAIL_DOMAIN}
virtual_mailbox_maps = texthash:{p}/conf/vmailbox
virtual_transport = lmtp:unix:{d}/lmtp
smtpd_peername_lookup = no
smtp_dns_support_level = disabled
lmtp_host_lookup = native
smtp_host_lookup = native
smtp_tls_security_level = none
smtpd_banner = $myhostname ESMTP stampd test
biff = no
smtpd_error_sleep_time = 0
smtpd_soft_error_limit = 100
maillog_file = /dev/stdout
smtpd_tls_cert_file = {self.cert_file}
smtpd_tls_key_file = {self.key_file}
smtpd_tls_security_level = encrypt
smtpd_tls_auth_only = yes
smtpd_sasl_auth_enable = yes
smtpd_sasl_type = dovecot
smtpd_sasl_path = {d}/auth
smtpd_client_restrictions = permit_sasl_authenticated, reject
smtpd_relay_restrictions = permit_sasl_authenticated, reject
smtpd_recipient_restrictions = permit_sasl_authenticated, reject
tls_random_source = dev:/dev/urandom
"""

    def _postfix_master(self) -> str:
        rows = [
            f"{self.host}:{self.smtp_port} inet n - n - - smtpd",
            # Plain SMTP for loopback clients: no TLS, no login (a server's relay).
            f"{self.host}:{self.plain_port} inet n - n - - smtpd"
            " -o smtpd_tls_security_level=none -o smtpd_tls_auth_only=no"
            " -o smtpd_sasl_auth_enable=no"
            " -o smtpd_client_restrictions=permit_mynetworks,reject"
            " -o smtpd_relay_restrictions=permit_mynetworks,reject"
            " -o smtpd_recipient_restrictions=permit_mynetworks,reject",
            "pickup unix n - n 60 1 pickup",
            "cleanup unix n - n - 0 cleanup",
            "qmgr unix n - n 300 1 qmgr",
            "tlsmgr unix - - n 1000? 1 tlsmgr",
            "rewrite unix - - n - - trivial-rewrite",
            "bounce unix - - n - 0 bounce",
            "defer unix - - n - 0 bounce",
            "trace unix - - n - 0 bounce",
            "verify unix - - n - 1 verify",
            "flush unix n - n 1000? 0 flush",
            "proxymap unix - - n - - proxymap",
            "smtp unix - - n - - smtp",
            "relay unix - - n - - smtp",
            "showq unix n - n - - showq",
            "error unix - - n - - error",
            "retry unix - - n - - error",
            "discard unix - - n - - discard",
            "lmtp unix - - n - - lmtp",
            "anvil unix - - n - 1 anvil",
            "scache unix - - n - 1 scache",
            "postlog unix-dgram n - n - 1 postlogd",
        ]
        return "\n".join(rows) + "\n"

    def _start_postfix(self) -> None:
        p = self.dir / "postfix"
        conf = p / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        _write_settled(conf / "main.cf", self._postfix_main())
        (conf / "master.cf").write_text(self._postfix_master())
        _write_settled(conf / "transport", "".join(
            f"{domain} smtp:[{host}]:{port}\n" for domain, (host, port) in self.routes.items()))
        owner = pwd.getpwnam("postfix")
        postdrop = grp.getgrnam("postdrop").gr_gid
        queue = p / "queue"
        queue.mkdir(exist_ok=True)
        for sub, mode in POSTFIX_DIRS:
            (queue / sub).mkdir(exist_ok=True)
            os.chown(queue / sub, owner.pw_uid, owner.pw_gid)
            os.chmod(queue / sub, mode)
        for sub, mode in (("maildrop", 0o730), ("public", 0o710)):
            (queue / sub).mkdir(exist_ok=True)
            os.chown(queue / sub, owner.pw_uid, postdrop)
            os.chmod(queue / sub, mode)
        (queue / "pid").mkdir(exist_ok=True)
        (p / "data").mkdir(exist_ok=True)
        os.chown(p / "data", owner.pw_uid, owner.pw_gid)
        self.postfix = subprocess.Popen(
            [str(POSTFIX_MASTER), "-c", str(conf), "-d"], stdin=subprocess.DEVNULL,
            start_new_session=True,  # (its SIGTERM handler signals its own process group)
            stdout=open(p / "stdout.log", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "MAIL_CONFIG": str(conf)})
        _wait_port(self.host, self.smtp_port, self.postfix, "Postfix", p / "stdout.log")
        _wait_port(self.host, self.plain_port, self.postfix, "Postfix", p / "stdout.log")

    # -- clients -------------------------------------------------------------------------------
    def smtp(self, user: MailUser) -> smtplib.SMTP:
        """A submission session, STARTTLS and login done."""
        s = smtplib.SMTP(self.host, self.smtp_port, timeout=30)
        try:
            s.starttls(context=self.ca.client_context())
            s.login(user.address, user.password)
        except BaseException:
            s.close()
            raise
        return s

    def imap(self, user: MailUser) -> imaplib.IMAP4:
        """An IMAP session, STARTTLS and login done."""
        m = imaplib.IMAP4(self.host, self.imap_port, timeout=30)
        try:
            m.starttls(ssl_context=self.ca.client_context())
            m.login(user.address, user.password)
        except BaseException:
            with contextlib.suppress(OSError):
                m.shutdown()
            raise
        return m

    def wait_for_messages(self, user: MailUser, count: int = 1, timeout: float = 30
                          ) -> list[bytes]:
        """The raw messages in ``user``'s INBOX once there are ``count`` (delivery through the
        queue takes a moment; a condition, not a timing)."""
        deadline = time.monotonic() + timeout
        m = self.imap(user)
        try:
            while True:
                m.select("INBOX")
                _typ, data = m.search(None, "ALL")
                ids = data[0].split()
                if len(ids) >= count or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            found = []
            for i in ids:
                _typ, msg = m.fetch(i, "(RFC822)")
                part = msg[0]
                assert isinstance(part, tuple)
                found.append(part[1])
            return found
        finally:
            with contextlib.suppress(Exception):
                m.logout()

    def log_tail(self) -> str:
        out = []
        for f in (self.dir / "postfix" / "stdout.log", self.dir / "dovecot" / "dovecot.log"):
            with contextlib.suppress(OSError):
                out.append(f"== {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# An email timestamper on the other side


def key_fpr(key: Path) -> str:
    return key.with_suffix(".fpr").read_text().strip()


class Responder:
    """The email timestamper: answers each request in the stamper's mailbox with a clear-signed
    reply from the stamper's address to the sender, quoting the request's body."""

    def __init__(self, servers: MailServers, user: MailUser) -> None:
        self.servers = servers
        self.user = user
        self.home = short_tmpdir("mr")
        os.chmod(self.home, 0o700)
        for key in (STAMPER_KEY, IMPOSTOR_KEY):
            self._gpg("--import", str(key.with_suffix(".sec.asc")))
        self.answered = 0

    def _gpg(self, *args: str, data: bytes | None = None) -> bytes:
        r = subprocess.run(["gpg", "--homedir", str(self.home), "--batch", "--no-tty",
                            "--pinentry-mode", "loopback", "--passphrase", "", *args],
                           input=data, capture_output=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr.decode()
        return r.stdout

    def requests(self, count: int) -> list[EmailMessage]:
        import email
        import email.policy

        raws = self.servers.wait_for_messages(self.user, count)
        assert len(raws) >= count, self.servers.log_tail()
        msgs = []
        for raw in raws:
            msg = email.message_from_bytes(raw, policy=email.policy.default)
            assert isinstance(msg, EmailMessage)
            msgs.append(msg)
        return msgs

    def answer(self, request: EmailMessage, *, key: Path = STAMPER_KEY,
               body: str | None = None, tamper: bool = False) -> None:
        """Reply to ``request``: its body quoted and clear-signed with ``key`` (``body``
        instead of the request's; ``tamper``: the signed text altered after signing)."""
        if body is None:
            body = request.get_body().get_content()  # type: ignore[union-attr]
        text = body.replace("\r\n", "\n")
        signed = (f"The following message was received at {time.ctime()}.\n\n{text}"
                  "\nEnd of the received message.\n")
        reply = self._gpg("--local-user", key_fpr(key), "--clearsign", data=signed.encode())
        if tamper:
            reply = reply.replace(b"git commit: ", b"git commit:  ", 1)
        self._send_reply(request, reply.decode())

    def answer_receipt(self, request: EmailMessage, *, key: Path = STAMPER_KEY,
                       digest: str | None = None) -> None:
        """Reply to a digest-mode ``request`` as a stampd mail listener would: a stampd
        receipt (formats.receipts) of the digest its body is (``digest`` instead), clear-signed
        with ``key``, and no quoted text."""
        from formats.receipts import Statement

        if digest is None:
            digest = request.get_body().get_content().strip()  # type: ignore[union-attr]
        statement = Statement("sha256", digest, int(time.time()), "http://b.test/", 1,
                              key_fpr(key))
        self._send_reply(request, self._gpg("--local-user", key_fpr(key), "--clearsign",
                                            data=statement.text().encode()).decode())

    def _send_reply(self, request: EmailMessage, text: str) -> None:
        msg = EmailMessage()
        msg["From"], msg["To"] = self.user.address, str(request["From"])
        msg["Subject"] = f"Re: {request['Subject']}"
        msg.set_content("Your timestamp:\n\n" + text)
        with self.servers.smtp(self.user) as s:
            s.send_message(msg)
        self.answered += 1

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"],
                       capture_output=True, timeout=30, check=False)
        shutil.rmtree(self.home, ignore_errors=True)
