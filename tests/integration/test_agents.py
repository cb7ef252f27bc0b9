"""Tests of workers.agents.gpg: a real gpg-agent signs, a real ``gpg --verify`` judges.

Every key type GnuPG 2.2 signs with is generated once per session (in a keygen home served by
a :class:`GpgAgent` of its own), exported to files, imported into a fresh agent in a fresh
0700 home, used over one persistent Assuan connection, and every signature is checked by
``gpg --verify --status-fd`` in a separate home that holds only the public keys: VALIDSIG with
the right fingerprint, creation time, algorithms and signature class 00.

Signature values with leading zero bytes (an MPI shorter than the group order) are the classic
interoperability bug of hand-built packets; for ECC and DSA keys the tests sign until such a
value has occurred (about one signature in 128) and assert it was covered.

The Assuan edge cases that a healthy agent never produces on demand (%-escaped binary data
split over D lines, inquiries, a silent peer) are played by a scripted peer on a socketpair.

Every agent a test starts is stopped by PID at teardown, and the PID is checked to be gone.
A missing GnuPG fails these tests; it never skips them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from formats.openpgp import (
    H_SHA256,
    KeyInfo,
    detached_signature,
    hash_algo_for,
    signature_digest,
    signature_hashed_part,
    signature_packet,
)
from tests.helpers import (
    KEY_TYPES,
    PASSPHRASE,
    GeneratedKey,
    KeyMaker,
    pid_gone,
    run_gpg,
    short_tmpdir,
)
from workers.agents.gpg import AssuanConnection, GpgAgent, GpgAgentError, agent_socket_path

SHORT_VALUE_CAP = 4000  # P(no leading zero byte in 2 x 4000 values) < (255/256)**8000 ~ 3e-14


def _expand(seed: bytes, size: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha512(seed + counter.to_bytes(8, "big")).digest()
        counter += 1
    return bytes(out[:size])


MESSAGES: list[bytes] = [
    b"",
    b"\x00",
    b"line one\r\nline two\rline three\n",  # binary mode: no line-ending normalisation
    (
        b"object 0123456789abcdef0123456789abcdef01234567\ntype commit\ntag stamp\n"
        b"tagger Test <t@example> 1700000000 +0000\n\n:watch: stamped\n"
    ),
    _expand(b"large", 300_000),
]


# ---------------------------------------------------------------------------------------------
# Fixtures (``gnupg`` and ``keys``, the generated test keys, are in tests/conftest.py)


@dataclass(frozen=True)
class ValidSig:
    fingerprint: str
    created: int
    pubkey_algo: int
    hash_algo: int
    sig_class: str
    primary: str


class Verifier:
    """``gpg --verify`` in a home holding only public keys."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._imported: set[str] = set()
        self._count = 0

    def add(self, key: GeneratedKey) -> None:
        if key.fingerprint not in self._imported:
            result = run_gpg(self.home, "--import", str(key.public_file))
            assert result.returncode == 0, result.stderr.decode()
            self._imported.add(key.fingerprint)

    def verify(self, data: bytes, signature: str | bytes) -> list[ValidSig]:
        """All VALIDSIG results; fails on any bad or unverifiable signature."""
        self._count += 1
        data_file = self.home / f"data{self._count}"
        sig_file = self.home / f"data{self._count}.sig"
        data_file.write_bytes(data)
        sig_file.write_bytes(signature.encode() if isinstance(signature, str) else signature)
        try:
            result = run_gpg(self.home, "--status-fd", "1", "--verify", str(sig_file),
                             str(data_file))
        finally:
            data_file.unlink()
            sig_file.unlink()
        status = result.stdout.decode().splitlines()
        bad = [line for line in status if line.split()[1:2] in (["BADSIG"], ["ERRSIG"])]
        assert not bad, bad
        assert result.returncode == 0, result.stderr.decode()
        valid = []
        for line in status:
            words = line.split()
            if words[1] == "VALIDSIG":
                valid.append(
                    ValidSig(words[2], int(words[4]), int(words[8]), int(words[9]), words[10],
                             words[11])
                )  # fmt: skip
        return valid


@pytest.fixture(scope="session")
def verifier(gnupg: dict[str, str]) -> Iterator[Verifier]:
    home = short_tmpdir("sv")
    try:
        yield Verifier(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def new_agent(gnupg: dict[str, str]) -> Iterator[Callable[..., GpgAgent]]:
    """Start agents in fresh 0700 homes; stop them all by PID at teardown."""
    agents: list[GpgAgent] = []
    pids: list[int] = []

    def start(**kwargs: Any) -> GpgAgent:
        agent = GpgAgent(short_tmpdir("sa"), **kwargs)
        agents.append(agent)
        agent.start()
        pids.append(agent.pid)
        return agent

    yield start
    for agent in agents:
        agent.stop()
        shutil.rmtree(agent.home, ignore_errors=True)
    assert [pid for pid in pids if not pid_gone(pid)] == []


def _signer(conn: AssuanConnection, info: KeyInfo) -> Callable[[int, bytes], list[int]]:
    return lambda hash_algo, digest: conn.sign(info.keygrip, hash_algo, digest)


# ---------------------------------------------------------------------------------------------
# Every key type, verified by gpg


@pytest.mark.parametrize("name", list(KEY_TYPES))
def test_signatures_verify_with_gpg(
    name: str, keys: KeyMaker, verifier: Verifier, new_agent: Callable[..., GpgAgent]
) -> None:
    kind = KEY_TYPES[name]
    key = keys.get(name)
    verifier.add(key)
    agent = new_agent()
    info = agent.import_secret_key(key.secret_file)
    assert info.fingerprint == key.fingerprint
    assert (info.pubkey_algo, info.bits, info.curve) == (kind.algo, kind.bits, kind.curve)
    assert info.uid == f"Test {name} <t@example>"
    hash_algo = hash_algo_for(info)
    conn = agent.connect()
    now = int(time.time())

    # Distinct messages, armored, each verified on its own.
    for i, data in enumerate(MESSAGES):
        created = now - 1000 + i
        text = detached_signature(data, info, created, _signer(conn, info))
        assert verifier.verify(data, text) == [
            ValidSig(info.fingerprint, created, info.pubkey_algo, hash_algo, "00", key.fingerprint)
        ]

    # Many signatures with distinct hashed data (their creation times differ), verified in
    # one gpg run; keep signing until a value with a leading zero byte has come up.
    data = b"bulk data\n"
    packets: list[bytes] = []
    created_times: list[int] = []
    short_values = 0
    first = now - 100_000
    while len(packets) < kind.count or (
        kind.must_cover_short_value and not short_values and len(packets) < SHORT_VALUE_CAP
    ):
        created = first + len(packets)
        hashed = signature_hashed_part(info, created, hash_algo)
        digest = signature_digest(data, hashed, hash_algo)
        values = conn.sign(info.keygrip, hash_algo, digest)
        short_values += any(value < 1 << 8 * (kind.order_bytes - 1) for value in values)
        packets.append(signature_packet(hashed, digest, info, values))
        created_times.append(created)
    valid = verifier.verify(data, b"".join(packets))
    assert sorted(sig.created for sig in valid) == created_times
    assert {(sig.fingerprint, sig.hash_algo, sig.sig_class) for sig in valid} == {
        (info.fingerprint, hash_algo, "00")
    }
    if kind.must_cover_short_value:
        assert short_values > 0, f"no leading-zero value in {len(packets)} signatures"


@pytest.mark.parametrize("name", ["nistp256", "dsa2048", "ed25519"])
def test_signatures_are_deterministic(
    name: str, keys: KeyMaker, new_agent: Callable[..., GpgAgent]
) -> None:
    # EdDSA by design, DSA/ECDSA because gpg-agent asks libgcrypt for RFC 6979 nonces.
    agent = new_agent()
    info = agent.import_secret_key(keys.get(name).secret_file)
    conn = agent.connect()
    digest = hashlib.sha256(b"same").digest()
    assert conn.sign(info.keygrip, H_SHA256, digest) == conn.sign(info.keygrip, H_SHA256, digest)


@pytest.mark.parametrize("name", ["ed25519", "nistp256", "rsa2048"])
def test_signatures_of_one_round_trip_are_those_made_one_by_one(
    name: str, keys: KeyMaker, new_agent: Callable[..., GpgAgent]
) -> None:
    # SIGKEY once, then SETHASH/PKSIGN per digest, in one write: the agent keeps the key.
    agent = new_agent()
    info = agent.import_secret_key(keys.get(name).secret_file)
    conn = agent.connect()
    digests = [hashlib.sha256(b"batch %d" % i).digest() for i in range(5)]
    assert conn.sign_many(info.keygrip, H_SHA256, digests) == [
        conn.sign(info.keygrip, H_SHA256, digest) for digest in digests]
    assert conn.sign_many(info.keygrip, H_SHA256, []) == []


@pytest.mark.parametrize(
    ("name", "refused"),
    [("nistp384", [H_SHA256]), ("nistp521", [H_SHA256, 9]), ("brainpoolP512r1", [9])],
)
def test_agent_refuses_digests_shorter_than_the_curve(
    name: str, refused: list[int], keys: KeyMaker, new_agent: Callable[..., GpgAgent]
) -> None:
    agent = new_agent()
    info = agent.import_secret_key(keys.get(name).secret_file)
    conn = agent.connect()
    sizes = {8: 32, 9: 48, 10: 64}
    for hash_algo in refused:
        with pytest.raises(GpgAgentError, match="Invalid length") as caught:
            conn.sign(info.keygrip, hash_algo, bytes(sizes[hash_algo]))
        assert caught.value.code is not None
    # ERR answers leave the connection usable; the hash we choose works.
    chosen = hash_algo_for(info)
    assert len(conn.sign(info.keygrip, chosen, bytes(sizes[chosen]))) == 2


def test_signing_subkey_is_chosen(
    keys: KeyMaker, verifier: Verifier, new_agent: Callable[..., GpgAgent]
) -> None:
    key = keys.get("ed25519-subkey")
    verifier.add(key)
    agent = new_agent()
    info = agent.import_secret_key(key.secret_file)
    assert info.fingerprint != key.fingerprint
    assert info.uid == "Test ed25519-subkey <t@example>"
    conn = agent.connect()
    text = detached_signature(b"sub", info, 1_600_000_000, _signer(conn, info))
    [valid] = verifier.verify(b"sub", text)
    assert (valid.fingerprint, valid.primary) == (info.fingerprint, key.fingerprint)


# ---------------------------------------------------------------------------------------------
# Passphrase-protected keys


def _record_argv(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every argv given to subprocess in this test (a spy: the calls still happen)."""
    seen: list[list[str]] = []
    real_popen_init = subprocess.Popen.__init__

    def spy(self: subprocess.Popen[bytes], args: Any, *rest: Any, **kwargs: Any) -> None:
        seen.append([str(arg) for arg in args])
        real_popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", spy)
    return seen


def test_protected_key_signs_with_passphrase(
    keys: KeyMaker,
    verifier: Verifier,
    new_agent: Callable[..., GpgAgent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = keys.get("ed25519-protected")
    verifier.add(key)
    argvs = _record_argv(monkeypatch)
    agent = new_agent(passphrase=PASSPHRASE)
    info = agent.import_secret_key(key.secret_file)
    conn = agent.connect()
    for created in (1_600_000_000, 1_600_000_001):
        text = detached_signature(b"protected", info, created, _signer(conn, info))
        [valid] = verifier.verify(b"protected", text)
        assert (valid.fingerprint, valid.created) == (key.fingerprint, created)
    assert any("--import" in argv for argv in argvs)
    assert not [argv for argv in argvs if any(PASSPHRASE in arg for arg in argv)]
    cmdline = Path(f"/proc/{agent.pid}/cmdline").read_bytes()
    assert PASSPHRASE.encode() not in cmdline


def test_protected_key_without_or_with_wrong_passphrase(
    keys: KeyMaker, new_agent: Callable[..., GpgAgent]
) -> None:
    key = keys.get("ed25519-protected")
    digest = hashlib.sha256(b"x").digest()
    for passphrase, reason in ((None, "cancel"), ("wrong", "Bad passphrase")):
        agent = new_agent(passphrase=passphrase)
        info = agent.import_secret_key(key.secret_file)  # gpg keeps the protection as is
        conn = agent.connect()
        with pytest.raises(GpgAgentError, match=reason):
            conn.sign(info.keygrip, H_SHA256, digest)
        assert conn.transact("GETINFO pid") == str(agent.pid).encode()  # still in sync


# ---------------------------------------------------------------------------------------------
# Lifecycle


def test_start_and_stop_by_pid(new_agent: Callable[..., GpgAgent]) -> None:
    agent = new_agent()
    pid = agent.pid
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[0].endswith(b"gpg-agent") and str(agent.home).encode() in cmdline
    assert agent.running
    assert agent.socket_path == agent_socket_path(agent.home)
    assert agent.socket_path.is_socket()
    conn = agent.connect()
    assert conn.transact("GETINFO pid") == str(pid).encode()

    agent.stop()
    assert pid_gone(pid)
    assert not agent.running
    assert not agent.socket_path.exists()
    assert conn.closed
    with pytest.raises(GpgAgentError):
        conn.transact("GETINFO pid")
    with pytest.raises(GpgAgentError):
        agent.pid  # noqa: B018
    with pytest.raises(GpgAgentError):
        agent.connect()
    agent.stop()  # idempotent


def test_context_manager_and_restart(gnupg: dict[str, str]) -> None:
    home = short_tmpdir("sc")
    try:
        with GpgAgent(home) as agent:
            first = agent.pid
        assert pid_gone(first)
        with GpgAgent(home) as agent:  # the same home serves again
            second = agent.pid
            assert agent.connect().transact("GETINFO pid") == str(second).encode()
        assert pid_gone(second)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_killed_agent_fails_the_next_signature(
    keys: KeyMaker, new_agent: Callable[..., GpgAgent]
) -> None:
    agent = new_agent()
    info = agent.import_secret_key(keys.get("ed25519").secret_file)
    conn = agent.connect()
    digest = hashlib.sha256(b"before").digest()
    conn.sign(info.keygrip, H_SHA256, digest)

    os.kill(agent.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while agent.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not agent.running
    # The broken connection (a closed stream or a broken pipe), not the 30 s answer deadline,
    # ends the request.
    with pytest.raises(GpgAgentError, match=r"closed|Broken pipe|reset") as gone:
        conn.sign(info.keygrip, H_SHA256, digest)
    assert "no answer" not in str(gone.value)
    with pytest.raises(GpgAgentError, match="unusable"):
        conn.sign(info.keygrip, H_SHA256, digest)
    with pytest.raises(GpgAgentError, match="died"):
        agent.connect()
    pid = agent.pid
    agent.stop()
    assert pid_gone(pid)


def _wait_until_stopped(pid: int) -> None:
    """Wait until every thread of ``pid`` is stopped: SIGSTOP takes effect asynchronously."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
        if states and all(state == "T" for state in states):
            return
        time.sleep(0.005)
    pytest.fail(f"process {pid} did not stop")


def test_unresponsive_agent_times_out(keys: KeyMaker, new_agent: Callable[..., GpgAgent]) -> None:
    agent = new_agent()
    info = agent.import_secret_key(keys.get("ed25519").secret_file)
    conn = agent.connect()
    assert conn.timeout == 30
    conn.timeout = 0.5
    os.kill(agent.pid, signal.SIGSTOP)
    try:
        _wait_until_stopped(agent.pid)
        # Without the deadline this call would block for as long as the agent is stopped.
        with pytest.raises(GpgAgentError, match=r"no answer within 0\.5"):
            conn.sign(info.keygrip, H_SHA256, bytes(32))
        assert conn.closed
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    assert conn.closed
    fresh = agent.connect()
    assert len(fresh.sign(info.keygrip, H_SHA256, bytes(32))) == 2


def test_clients_hanging_up_do_not_kill_the_agent(new_agent: Callable[..., GpgAgent]) -> None:
    # A supervised gpg-agent does not ignore SIGPIPE by itself; GpgAgent makes it.
    agent = new_agent()
    for _ in range(5):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(agent.socket_path))  # and go before the greeting is written
    conn = agent.connect()
    conn.transact("GETINFO pid")
    conn.close()  # an Assuan client that leaves without BYE
    assert agent.connect().transact("GETINFO pid") == str(agent.pid).encode()
    assert agent.running


def test_refusals(keys: KeyMaker, new_agent: Callable[..., GpgAgent]) -> None:
    agent = new_agent()
    with pytest.raises(GpgAgentError, match="already started"):
        agent.start()
    with pytest.raises(GpgAgentError, match="already listens"):
        GpgAgent(agent.home).start()
    with pytest.raises(GpgAgentError, match="no secret key"):
        agent.import_secret_key(keys.get("ed25519").public_file)
    with pytest.raises(GpgAgentError, match="cannot import"):
        agent.import_secret_key(agent.home / "missing.asc")
    conn = agent.connect()
    with pytest.raises(GpgAgentError) as caught:
        conn.sign("00" * 20, H_SHA256, bytes(32))
    assert caught.value.code is not None
    with pytest.raises(ValueError):
        conn.sign("zz" * 20, H_SHA256, bytes(32))
    with pytest.raises(ValueError):
        conn.sign("00" * 20, H_SHA256, bytes(31))
    assert conn.transact("GETINFO pid") == str(agent.pid).encode()


def test_home_must_be_private_and_short(gnupg: dict[str, str]) -> None:
    home = short_tmpdir("sp")
    try:
        home.chmod(0o755)
        with pytest.raises(GpgAgentError, match="private"):
            GpgAgent(home).start()
        home.chmod(0o700)
        deep = home / ("d" * 100)
        deep.mkdir(mode=0o700)
        with pytest.raises(GpgAgentError, match="longer than"):
            GpgAgent(deep).start()
        with pytest.raises(GpgAgentError, match="unusable"):
            GpgAgent(home / "absent").start()
        with pytest.raises(GpgAgentError, match="not started"):
            GpgAgent(home).import_secret_key(home / "x")
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_agent_that_cannot_start(gnupg: dict[str, str]) -> None:
    home = short_tmpdir("sn")
    try:
        agent = GpgAgent(home, gpg_agent=str(home / "no-such-gpg-agent"))
        with pytest.raises(GpgAgentError, match="did not start"):
            agent.start()
        assert not agent.running
        assert not agent_socket_path(home).exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_agent_socket_path_matches_gpgconf(gnupg: dict[str, str]) -> None:
    home = short_tmpdir("sg")
    try:
        listed = subprocess.run(
            ["gpgconf", "--homedir", str(home), "--list-dirs", "agent-socket"],
            capture_output=True,
            check=True,
        )
        assert agent_socket_path(home) == Path(listed.stdout.decode().strip())
        assert list(home.iterdir()) == []  # nothing started, nothing created
    finally:
        shutil.rmtree(home, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Assuan details, with a scripted peer


class ScriptedAgent:
    """The far end of a socketpair, playing gpg-agent from a script in a thread."""

    def __init__(self, script: Callable[[ScriptedAgent], None]) -> None:
        self.client, self.server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.reader = self.server.makefile("rb")
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def _run(self, script: Callable[[ScriptedAgent], None]) -> None:
        try:
            self.send(b"OK Pleased to meet you\n")
            self.expect(b"OPTION pinentry-mode=loopback")
            self.send(b"OK\n")
            script(self)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def send(self, data: bytes) -> None:
        self.server.sendall(data)

    def expect(self, prefix: bytes) -> bytes:
        line = self.reader.readline()
        assert line.startswith(prefix) and line.endswith(b"\n"), line
        return line[:-1]

    def finish(self) -> None:
        self.thread.join(5)
        assert not self.thread.is_alive()
        self.reader.close()
        self.server.close()
        if self.error is not None:
            raise self.error


@pytest.fixture
def scripted() -> Iterator[Callable[..., tuple[ScriptedAgent, AssuanConnection]]]:
    peers: list[tuple[ScriptedAgent, AssuanConnection]] = []

    def make(
        script: Callable[[ScriptedAgent], None], passphrase: str | None = None
    ) -> tuple[ScriptedAgent, AssuanConnection]:
        peer = ScriptedAgent(script)
        conn = AssuanConnection(peer.client, passphrase=passphrase, timeout=5)
        peers.append((peer, conn))
        return peer, conn

    yield make
    for peer, conn in peers:
        conn.close()
        peer.finish()


def _escape(data: bytes) -> bytes:
    return data.replace(b"%", b"%25").replace(b"\r", b"%0D").replace(b"\n", b"%0A")


def _atom(data: bytes) -> bytes:
    return str(len(data)).encode() + b":" + data


def test_sign_reads_escaped_binary_data_over_several_lines(
    scripted: Callable[..., tuple[ScriptedAgent, AssuanConnection]],
) -> None:
    r = b"\x00\n%\r" + bytes(range(28))  # a leading zero byte and every byte Assuan escapes
    s = b"\n" * 32
    sexp = b"(7:sig-val(5:eddsa(1:r" + _atom(r) + b")(1:s" + _atom(s) + b")))"
    escaped = _escape(sexp)
    digest = hashlib.sha256(b"m").digest()

    def script(peer: ScriptedAgent) -> None:
        peer.expect(b"SIGKEY " + b"AB" * 20)
        peer.send(b"OK\n")
        assert peer.expect(b"SETHASH ") == b"SETHASH --hash=sha256 " + digest.hex().upper().encode()
        peer.send(b"OK\n")
        peer.expect(b"PKSIGN")
        peer.send(b"S PROGRESS need_entropy X 30 120\n# a comment\nINQUIRE PASSPHRASE\n")
        answer = peer.expect(b"D ")
        assert answer == b"D " + _escape(PASSPHRASE.encode())
        peer.expect(b"END")
        peer.send(b"INQUIRE SOMETHING_ELSE\n")
        peer.expect(b"CAN")
        peer.send(b"D " + escaped[:40] + b"\nD " + escaped[40:] + b"\nOK\n")

    _peer, conn = scripted(script, passphrase=PASSPHRASE)
    values = conn.sign("ab" * 20, H_SHA256, digest)
    assert values == [int.from_bytes(r, "big"), int.from_bytes(s, "big")]


def test_an_error_within_a_batch_keeps_the_connection_in_step(
    scripted: Callable[..., tuple[ScriptedAgent, AssuanConnection]],
) -> None:
    sexp = b"(7:sig-val(5:eddsa(1:r1:\x01)(1:s1:\x02)))"

    def script(peer: ScriptedAgent) -> None:
        assert peer.expect(b"SIGKEY ") == b"SIGKEY " + b"AB" * 20
        for _ in range(3):
            peer.expect(b"SETHASH ")
            peer.expect(b"PKSIGN")
        peer.send(b"OK\nOK\nD " + sexp + b"\nOK\nOK\nERR 67108881 Bad signature\nOK\nD "
                  + sexp + b"\nOK\n")
        peer.expect(b"GETINFO pid")
        peer.send(b"D 42\nOK\n")

    _peer, conn = scripted(script)
    digest = hashlib.sha256(b"m").digest()
    with pytest.raises(GpgAgentError, match="Bad signature"):
        conn.sign_many("ab" * 20, H_SHA256, [digest] * 3)
    assert conn.transact("GETINFO pid") == b"42"


def test_inquiry_without_passphrase_is_cancelled(
    scripted: Callable[..., tuple[ScriptedAgent, AssuanConnection]],
) -> None:
    def script(peer: ScriptedAgent) -> None:
        peer.expect(b"GETINFO version")
        peer.send(b"INQUIRE NEW_PASSPHRASE\n")
        peer.expect(b"CAN")
        peer.send(b"ERR 83886179 Operation cancelled <Pinentry>\n")
        peer.expect(b"GETINFO version")
        peer.send(b"D 2.2.40\nOK\n")

    _peer, conn = scripted(script)
    with pytest.raises(GpgAgentError, match="cancelled") as caught:
        conn.transact("GETINFO version")
    assert caught.value.code == 83886179
    assert conn.transact("GETINFO version") == b"2.2.40"


def test_long_passphrase_is_split_into_short_d_lines(
    scripted: Callable[..., tuple[ScriptedAgent, AssuanConnection]],
) -> None:
    passphrase = "%" * 700 + "x" * 1500  # escapes to 3600 bytes

    def script(peer: ScriptedAgent) -> None:
        peer.expect(b"GETINFO pid")
        peer.send(b"INQUIRE PASSPHRASE\n")
        received = bytearray()
        while True:
            line = peer.reader.readline()
            assert len(line) <= 1000
            if line == b"END\n":
                break
            assert line.startswith(b"D ")
            assert not re.search(rb"%.?\n$", line), "an escape split across lines"
            received += line[2:-1]
        assert received.decode().replace("%25", "%") == passphrase
        peer.send(b"OK\n")

    _peer, conn = scripted(script, passphrase=passphrase)
    assert conn.transact("GETINFO pid") == b""


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"", "no answer"),
        (b"garbage\n", "unexpected line"),
        (b"D (7:sig-val\n", "closed"),
        (b"D 1:%zz\n", "bad %-escape"),
    ],
)
def test_broken_peer_breaks_the_connection(
    answer: bytes,
    message: str,
    scripted: Callable[..., tuple[ScriptedAgent, AssuanConnection]],
) -> None:
    done = threading.Event()

    def script(peer: ScriptedAgent) -> None:
        peer.expect(b"SIGKEY")
        peer.send(answer)
        if message == "closed":
            peer.server.shutdown(socket.SHUT_WR)
        done.wait(5)

    _peer, conn = scripted(script)
    conn.timeout = 0.3
    with pytest.raises(GpgAgentError, match=message):
        conn.sign("00" * 20, H_SHA256, bytes(32))
    done.set()
    assert conn.closed
    with pytest.raises(GpgAgentError, match="unusable"):
        conn.transact("GETINFO pid")


def test_bad_signature_data_is_an_agent_error(
    scripted: Callable[..., tuple[ScriptedAgent, AssuanConnection]],
) -> None:
    def script(peer: ScriptedAgent) -> None:
        for _ in range(3):
            peer.reader.readline()
        peer.send(b"OK\nOK\nD (7:sig-val(3:foo))\nOK\n")

    _peer, conn = scripted(script)
    with pytest.raises(GpgAgentError, match="unusable signature"):
        conn.sign("00" * 20, H_SHA256, bytes(32))
    assert not conn.closed


def test_transact_refuses_multi_line_commands(
    scripted: Callable[..., tuple[ScriptedAgent, AssuanConnection]],
) -> None:
    _peer, conn = scripted(lambda peer: None)
    with pytest.raises(ValueError):
        conn.transact("GETINFO pid\nKILLAGENT")
