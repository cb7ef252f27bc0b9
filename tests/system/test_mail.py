"""stampd as an e-mail timestamper (docs/mail.md), end to end: a real `stampd serve` with its SMTP
listener on a free port, mail sent with smtplib, the replies received by a real SMTP server
(aiosmtpd's Controller, in this process), checked with the real gpg against the mail key of
/v1/keys, and their serials' proofs fetched from the transparency log. Every refusal is
checked to record nothing and answer nothing."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import email
import hashlib
import http.client
import json
import os
import signal
import smtplib
import socket
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from formats.receipts import parse_statement, split_receipt
from formats.tlog.entry import Entry
from formats.tlog.proof import TlogProof
from tests.helpers import (
    Server,
    free_port,
    keyring,
    proc_names,
    run_stampd,
    seed_data_dir,
    start_server,
    wait_for,
)

OWN = ("stamp@stampd.test", "ts@stampd.test")
SESSIONS = 4
PER_DOMAIN = 5
MAX_SIZE = 64 * 1024
HOLD = 5.0  # seconds the relay holds its answer to a reply for a ``held-`` address
BEGIN = "-----BEGIN PGP SIGNED MESSAGE-----"
END = "-----END PGP SIGNATURE-----"


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    content: bytes


@dataclass
class Store:
    """What the relay received, in order."""

    messages: list[Received] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          rcpt_options: list[str]) -> str:
        """A relay that refuses some recipients: for good (``refuse5-...``), for now
        (``refuse4-...``)."""
        if address.startswith("refuse5-"):
            return "550 5.1.1 no such user"
        if address.startswith("refuse4-"):
            return "450 4.2.1 mailbox busy"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if any(r.startswith("held-") for r in envelope.rcpt_tos):  # a slow relay
            await asyncio.sleep(HOLD)
        with self.arrived:
            self.messages.append(Received(envelope.mail_from, list(envelope.rcpt_tos),
                                          envelope.original_content))
            self.arrived.notify_all()
        return "250 OK"

    def to(self, address: str) -> list[Received]:
        with self.arrived:
            return [m for m in self.messages if address in m.rcpt_tos]


class Relay:
    """A real SMTP server on a free port, storing what it receives; stopped and started again
    on the same port (a relay down, then back)."""

    def __init__(self) -> None:
        self.store = Store()
        self.port = free_port()
        self.controller: Controller | None = None
        self.start()

    def start(self) -> None:
        self.controller = Controller(self.store, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None


@pytest.fixture(scope="module")
def relay() -> Iterator[Relay]:
    r = Relay()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, relay: Relay) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("mail") / "data")
    mail_port = free_port()
    s = start_server(data, workers=1, commit_interval=3600, extra_env={
        "STAMPD_TLOG": "on",
        "STAMPD_MAIL_LISTEN": f"127.0.0.1:{mail_port}",
        "STAMPD_MAIL_RELAY": f"127.0.0.1:{relay.port}",
        "STAMPD_MAIL_ADDRESSES": ",".join(OWN),
        "STAMPD_MAIL_MAX_RECIPIENTS": "2",
        "STAMPD_MAIL_MAX_SIZE": str(MAX_SIZE),
        "STAMPD_MAIL_MAX_ATTACHMENTS": "3",
        "STAMPD_MAIL_PER_SENDER_DOMAIN_MINUTE": str(PER_DOMAIN),
        "STAMPD_MAIL_PER_MINUTE": "100000",
        "STAMPD_MAIL_SESSIONS": str(SESSIONS),
    })
    s.mail_port = mail_port  # type: ignore[attr-defined]
    yield s
    s.stop()


def smtp(server: Server) -> smtplib.SMTP:
    return smtplib.SMTP("127.0.0.1", server.mail_port, timeout=60)  # type: ignore[attr-defined]


def message(sender: str, *, headers: tuple[str, ...] = (), body: str = "hello\r\n",
            message_id: str | None = None) -> bytes:
    """A message with CRLF line ends and no line starting with '.', so that the bytes stampd
    receives are exactly these (smtplib neither changes nor dot-stuffs them)."""
    message_id = message_id or f"<{hashlib.sha256(body.encode()).hexdigest()[:16]}.{sender}>"
    lines = [f"From: {sender}", f"To: {OWN[0]}", "Subject: please stamp",
             f"Message-ID: {message_id}", *headers, ""]
    return ("\r\n".join(lines) + "\r\n" + body).encode()


def send(server: Server, sender: str, data: bytes, to: tuple[str, ...] = (OWN[0],)
         ) -> tuple[int, bytes]:
    """(code, text) of the answer to DATA."""
    with smtp(server) as s:
        s.ehlo("client.test")
        code, text = s.mail(sender)
        assert code == 250, (code, text)
        for r in to:
            code, text = s.rcpt(r)
            assert code == 250, (code, text)
        return s.data(data)


def http_get(server: Server, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=90)
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, r.read()


def mail_key(server: Server, tmp: Path) -> tuple[str, Path]:
    """The mail key's fingerprint, and a GNUPGHOME holding its public key from /v1/keys."""
    status, body = http_get(server, "/v1/keys")
    assert status == 200
    (key,) = [k for k in json.loads(body)["keys"] if k["purpose"] == "mail"]
    assert key["format"] == "openpgp" and not key["primary"]
    (tmp / "mail.asc").write_text(key["public_key"])
    return key["fingerprint"], keyring(tmp / "mail.asc", tmp / "gnupg")


def receipts(reply: bytes) -> list[str]:
    """The cleartext-signed receipts in a reply's body, in order."""
    text = reply.decode("ascii").split("\r\n\r\n", 1)[1].replace("\r\n", "\n")
    out = []
    while BEGIN in text:
        start = text.index(BEGIN)
        end = text.index(END, start) + len(END) + 1
        out.append(text[start:end])
        text = text[end:]
    return out


def gpg_verify(text: str, home: Path) -> str:
    r = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--status-fd", "1",
                        "--verify"], input=text, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def digest_rows(server: Server) -> int:
    with sqlite3.connect(server.data_dir / "stampd.sqlite3") as db:
        return int(db.execute("select count(*) from stamps").fetchone()[0])


def test_a_mail_is_stamped_answered_and_in_the_log(server: Server, relay: Relay,
                                                   tmp_path: Path) -> None:
    sender = "alice@one.example"
    attachment = b"%PDF-1.4 not really\n" * 40

    b64 = base64.encodebytes(attachment).decode().replace("\n", "\r\n")
    boundary = "b0undary"
    body = (f"--{boundary}\r\nContent-Type: text/plain\r\n\r\nplease stamp this\r\n"
            f"--{boundary}\r\nContent-Type: application/pdf\r\n"
            f"Content-Disposition: attachment; filename=\"x.pdf\"\r\n"
            f"Content-Transfer-Encoding: base64\r\n\r\n{b64}--{boundary}--\r\n")
    data = message(sender, headers=("MIME-Version: 1.0",
                                    f"Content-Type: multipart/mixed; boundary={boundary}"),
                   body=body, message_id="<m1@one.example>")
    code, text = send(server, sender, data)
    assert code == 250, text
    (reply,) = relay.store.to(sender)
    assert reply.mail_from == "<>"  # (RFC 3834: the reply itself is never answered or bounced)
    head = reply.content.split(b"\r\n\r\n", 1)[0].decode()
    assert f"From: {OWN[0]}" in head and "Auto-Submitted: auto-replied" in head
    assert "In-Reply-To: <m1@one.example>" in head
    fingerprint, home = mail_key(server, tmp_path)
    # gpg --verify takes the reply's text as it is (its first receipt), and each receipt.
    parsed = email.message_from_bytes(reply.content)
    text, *attached = [p.get_payload(decode=True) for p in parsed.walk()
                       if not p.is_multipart()]
    assert f"VALIDSIG {fingerprint}" in gpg_verify(text.decode(), home)
    assert len(attached) == 1 and f"VALIDSIG {fingerprint}" in gpg_verify(attached[0].decode(),
                                                                          home)
    found = receipts(reply.content)
    assert len(found) == 2
    statements = [parse_statement(split_receipt(r)[0]) for r in found]
    for r in found:
        assert f"VALIDSIG {fingerprint}" in gpg_verify(r, home)
    assert statements[0].digest == hashlib.sha256(data).hexdigest()
    assert statements[1].digest == hashlib.sha256(attachment).hexdigest()
    assert {s.key for s in statements} == {fingerprint}
    assert f"serial {statements[0].serial}" in text.decode()
    # stampd verify checks a receipt against the attachment, trusting the mail key only
    (tmp_path / "receipt.asc").write_text(found[1])
    (tmp_path / "x.pdf").write_bytes(attachment)
    r = run_stampd(["verify", tmp_path / "receipt.asc", "--key", tmp_path / "mail.asc",
                    "--file", tmp_path / "x.pdf"])
    assert r.returncode == 0, r.stdout + r.stderr
    status_code, metrics = http_get(server, "/metrics")
    assert b'stampd_requests_total{status="250",type="mail"}' in metrics
    for st in statements:
        status_code, proof = http_get(server, f"/v1/proofs/{st.serial}?wait=30")
        assert status_code == 200, proof
        extra = TlogProof.parse(proof).extra
        assert extra is not None
        entry = Entry.parse(extra)
        assert (entry.serial, entry.kind, entry.digest, entry.key) == (
            st.serial, "digest", st.digest, fingerprint)


def test_a_body_that_is_only_a_digest_stamps_that_digest(server: Server, relay: Relay,
                                                        tmp_path: Path) -> None:
    sender = "bob@two.example"
    digest = hashlib.sha512(b"my file").hexdigest()
    code, text = send(server, sender, message(sender, body=f"  {digest.upper()}\r\n"))
    assert code == 250, text
    (reply,) = relay.store.to(sender)
    (receipt,) = receipts(reply.content)
    st = parse_statement(split_receipt(receipt)[0])
    assert (st.algorithm, st.digest) == ("sha512", digest)
    # a one-receipt reply saved whole, headers and all, is what gpg --verify takes
    fingerprint, home = mail_key(server, tmp_path)
    assert f"VALIDSIG {fingerprint}" in gpg_verify(reply.content.decode(), home)


REFUSED_DATA = {
    "auto-submitted": (("Auto-Submitted: auto-replied",), 550),
    "precedence": (("Precedence: bulk",), 550),
    "list": (("List-Id: <x.lists.example>",), 550),
    "report": (("MIME-Version: 1.0", "Content-Type: multipart/report; report-type="
                "delivery-status; boundary=x"), 550),
    "autoreply-suppress": (("X-Auto-Response-Suppress: All",), 550),
}


@pytest.mark.parametrize("case", sorted(REFUSED_DATA))
def test_what_must_not_be_answered_is_refused_and_recorded_nowhere(
        server: Server, relay: Relay, case: str) -> None:
    sender = f"x@{case}.example"
    headers, want = REFUSED_DATA[case]
    before = digest_rows(server)
    code, _text = send(server, sender, message(sender, headers=headers))
    assert code == want
    assert relay.store.to(sender) == []
    assert digest_rows(server) == before


MALFORMED = {
    "no header": b"no header at all, just words\r\n",
    "empty": b"\r\n\r\n",
    "binary": bytes(range(256)) * 4,
    "too many headers": b"".join(b"X-%d: y\r\n" % i for i in range(1100)) + b"\r\nbody\r\n",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_messages_are_refused(server: Server, relay: Relay, case: str) -> None:
    sender = f"m@{case.replace(' ', '-')}.malformed.example"
    before = digest_rows(server)
    with smtp(server) as s:
        s.ehlo("client.test")
        assert s.mail(sender)[0] == 250 and s.rcpt(OWN[0])[0] == 250
        code, _ = s.data(MALFORMED[case])
    assert code in (500, 554)  # (500: aiosmtpd's own, for a line over 1000 bytes)
    assert relay.store.to(sender) == []
    assert digest_rows(server) == before


def test_too_many_attachments_are_refused(server: Server, relay: Relay) -> None:
    sender = "a@attach.example"
    parts = "".join(f"--b\r\nContent-Disposition: attachment; filename=f{i}\r\n\r\nz{i}\r\n"
                    for i in range(4))
    data = message(sender, headers=("MIME-Version: 1.0",
                                    "Content-Type: multipart/mixed; boundary=b"),
                   body=parts + "--b--\r\n")
    before = digest_rows(server)
    code, _ = send(server, sender, data)
    assert code == 554
    assert relay.store.to(sender) == [] and digest_rows(server) == before


def test_a_bounce_is_refused(server: Server, relay: Relay) -> None:
    with smtp(server) as s:
        s.ehlo("client.test")
        code, _ = s.mail("")
    assert code == 550


def test_relaying_is_refused(server: Server) -> None:
    with smtp(server) as s:
        s.ehlo("client.test")
        assert s.mail("r@relay.example")[0] == 250
        assert s.rcpt("victim@elsewhere.example")[0] == 550
        assert s.rcpt("stamp@stampd.test.elsewhere.example")[0] == 550
        assert s.rcpt(OWN[1].upper())[0] == 250  # (addresses compare without case)


def test_too_many_recipients(server: Server) -> None:
    with smtp(server) as s:
        s.ehlo("client.test")
        assert s.mail("r@rcpts.example")[0] == 250
        assert s.rcpt(OWN[0])[0] == 250
        assert s.rcpt(OWN[1])[0] == 250
        assert s.rcpt(OWN[0])[0] == 452


def test_oversize_is_refused(server: Server, relay: Relay) -> None:
    sender = "big@size.example"
    data = message(sender, body=("y" * 76 + "\r\n") * (MAX_SIZE // 78 + 10))
    with smtp(server) as s:
        s.ehlo("client.test")
        assert s.mail(sender)[0] == 250 and s.rcpt(OWN[0])[0] == 250
        code, _ = s.data(data)
    assert code == 552
    assert relay.store.to(sender) == []


def test_the_rate_per_sender_domain_is_bounded(server: Server) -> None:
    """Each transaction counts against its sender's domain; beyond PER_DOMAIN in one clock
    minute, 451 (the sender's MTA tries again later). Two minutes' worth of attempts are
    made, so that a refusal comes whenever the minute turns."""
    codes = []
    with smtp(server) as s:
        s.ehlo("client.test")
        for _ in range(2 * PER_DOMAIN + 1):
            code, text = s.mail("r@rated.example")
            codes.append(code)
            s.rset()
            if code != 250:
                assert code == 451 and b"4.7.1" in text, text
                break
    assert codes[-1] == 451
    with smtp(server) as s:  # another domain is not held up
        s.ehlo("client.test")
        assert s.mail("r@unrated.example")[0] == 250


def test_relay_down_answers_451_and_sends_nothing(server: Server, relay: Relay) -> None:
    sender = "d@down.example"
    data = message(sender, body="while the relay is down\r\n")
    relay.stop()
    try:
        code, text = send(server, sender, data)
        assert code == 451, text
    finally:
        relay.start()
    assert relay.store.to(sender) == []
    code, text = send(server, sender, data)  # the sender's MTA tries again: answered once
    assert code == 250, text
    assert len(relay.store.to(sender)) == 1


@pytest.mark.parametrize(("sender", "want"), [("refuse5-x@relayed.example", 550),
                                               ("refuse4-x@relayed.example", 451)])
def test_a_reply_the_relay_refuses(server: Server, relay: Relay, sender: str, want: int) -> None:
    """The relay refuses the sender's address for good: 550 (a retry would not help); for now:
    451 (the sender's MTA tries again). No reply either way."""
    code, text = send(server, sender, message(sender, body=f"{sender}\r\n"))
    assert code == want, text
    assert relay.store.to(sender) == []


def test_a_flood_is_bounded_and_nothing_accepted_is_lost(server: Server, relay: Relay) -> None:
    """Many senders at once: more sessions than allowed are told 421 at once; each message
    answered 250 has exactly one reply at the relay, each refused one none."""

    def one(i: int) -> tuple[str, int]:
        sender = f"f{i}@flood{i}.example"
        try:
            with smtp(server) as s:
                s.ehlo("client.test")
                if s.mail(sender)[0] != 250 or s.rcpt(OWN[0])[0] != 250:
                    return sender, 0
                code, _ = s.data(message(sender, body=f"flood {i}\r\n"))
                return sender, code
        except smtplib.SMTPServerDisconnected:
            return sender, 421
        except smtplib.SMTPConnectError as e:
            return sender, e.smtp_code

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(24)))
    codes = [c for _, c in results]
    assert codes.count(250) >= 1
    assert all(c in (250, 421, 451, 0) for c in codes), codes
    for sender, code in results:
        assert len(relay.store.to(sender)) == (1 if code == 250 else 0), (sender, code)


def test_sessions_beyond_the_limit_are_told_421(server: Server) -> None:
    """SESSIONS sessions held open: the next connection is told 421 at once and closed; once
    they close, sessions are taken again."""
    held: list[smtplib.SMTP] = []
    refused = None
    try:
        for _ in range(SESSIONS + 1):
            try:
                s = smtp(server)
            except smtplib.SMTPConnectError as e:
                refused = e.smtp_code
                break
            s.ehlo("client.test")
            held.append(s)
        assert refused == 421
    finally:
        for s in held:
            s.quit()

    def open_again() -> bool:
        try:
            with smtp(server) as s:
                return s.ehlo("client.test")[0] == 250
        except smtplib.SMTPConnectError:
            return False

    wait_for(open_again, what="a session once the others closed")


def listeners_of(port: int) -> list[int]:
    """The processes holding a socket that listens on ``port`` (IPv4, TCP)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                pids.append(int(fd_dir.parent.name))
        except OSError:  # (gone, or not ours to read)
            continue
    return pids


def test_two_http_processes_and_only_what_the_mta_passed(tmp_path: Path, relay: Relay) -> None:
    """With two HTTP processes the listener runs in the first only (one port, one owner of the
    rates); with STAMPD_MAIL_AUTHSERV_ID only messages that MTA marked as passing for the
    sender's domain are answered; the rate in all is bounded; the listener comes back with a
    new process 0."""
    mail_port = free_port()
    s = start_server(seed_data_dir(tmp_path / "data"), workers=1, api_processes=2, extra_env={
        "STAMPD_MAIL_LISTEN": f"127.0.0.1:{mail_port}",
        "STAMPD_MAIL_RELAY": f"127.0.0.1:{relay.port}",
        "STAMPD_MAIL_ADDRESSES": OWN[0],
        "STAMPD_MAIL_AUTHSERV_ID": "mx.stampd.test",
        "STAMPD_MAIL_PER_MINUTE": "4"})
    try:
        s.mail_port = mail_port  # type: ignore[attr-defined]
        forged = "victim@forged.example"
        code, _ = send(s, forged, message(forged, headers=(
            "Authentication-Results: mx.stampd.test; spf=fail smtp.mailfrom=forged.example",)))
        assert code == 550 and relay.store.to(forged) == []
        # DMARC vouches for the From: header's domain, not the envelope sender the reply goes to
        code, _ = send(s, forged, message(forged, headers=(
            "Authentication-Results: mx.stampd.test; dmarc=pass header.from=attacker.example",)))
        assert code == 550 and relay.store.to(forged) == []
        upstream = "u@upstream.example"  # a header of another authserv-id proves nothing
        code, _ = send(s, upstream, message(upstream, headers=(
            "Authentication-Results: elsewhere.example; dmarc=pass",)))
        assert code == 550 and relay.store.to(upstream) == []
        sender = "carol@three.example"
        code, text = send(s, sender, message(sender, headers=(
            "Authentication-Results: mx.stampd.test; spf=pass smtp.mailfrom=carol@three.example",
        )))
        assert code == 250, text
        assert len(relay.store.to(sender)) == 1
        holders = {proc_names().get(p, ("?", 0))[0] for p in listeners_of(mail_port)}
        assert holders == {"stampd-http-0"}, holders
        # The rate in all: at most 4 transactions a clock minute from any domains, so of 9
        # more (with the 3 above, more than two minutes' worth) one is refused.
        with smtp(s) as session:
            session.ehlo("client.test")
            for i in range(9):
                code, text = session.mail(f"r@d{i}.rated.example")
                session.rset()
                if code != 250:
                    break
        assert code == 451 and b"4.7.1" in text, text
        # HTTP process 0 killed: the HTTP manager starts it again, and with it the listener
        (pid,) = listeners_of(mail_port)
        os.kill(pid, signal.SIGKILL)

        def listening_again() -> bool:
            return any(p != pid for p in listeners_of(mail_port))

        wait_for(listening_again, timeout=60, what="the mail listener of the new process 0")
        with smtp(s) as session:
            assert session.ehlo("client.test")[0] == 250
    finally:
        s.stop()


def test_a_session_looping_on_noop_is_closed(server: Server) -> None:
    with smtp(server) as s:
        s.ehlo("client.test")
        codes = [s.noop()[0] for _ in range(20)]
        assert codes == [250] * 20
        assert s.noop()[0] == 421


def test_an_answer_slower_than_the_idle_timeout_is_given_once(tmp_path: Path,
                                                              relay: Relay) -> None:
    """STAMPD_MAIL_TIMEOUT is the sender's idle time, not the server's: a message whose answer
    takes longer (the relay holds its reply HOLD seconds, past a 2 s timeout) is answered 250
    on its connection and replied to once; the session then idles out as before. (Closed
    while answering, the sender would have sent it again: a second stamp, a second reply.)
    The session is sent in one write, so that no pause of this client counts against it."""
    mail_port = free_port()
    s = start_server(seed_data_dir(tmp_path / "data"), workers=1, extra_env={
        "STAMPD_MAIL_LISTEN": f"127.0.0.1:{mail_port}",
        "STAMPD_MAIL_RELAY": f"127.0.0.1:{relay.port}",
        "STAMPD_MAIL_ADDRESSES": OWN[0], "STAMPD_MAIL_TIMEOUT": "2"})
    try:
        sender = "held-h@slow.example"
        session = (b"EHLO client.test\r\nMAIL FROM:<" + sender.encode() + b">\r\n"
                   b"RCPT TO:<" + OWN[0].encode() + b">\r\nDATA\r\n"
                   + message(sender, body="held by the relay\r\n") + b".\r\nNOOP\r\n")
        with socket.create_connection(("127.0.0.1", mail_port), timeout=60) as sock:
            sock.sendall(session)
            received = b""
            while chunk := sock.recv(65536):  # (until the server closes: the idle timeout)
                received += chunk
        codes = [int(line[:3]) for line in received.split(b"\r\n")
                 if line and line[3:4] != b"-"]
        assert codes == [220, 250, 250, 250, 354, 250, 250], received
        assert b"250 2.0.0 stamped, serial" in received, received
        assert len(relay.store.to(sender)) == 1
    finally:
        s.stop()
