"""A private ssh-agent: lifecycle by PID, key loading, the agent protocol and its failures.

Real ssh-agent, ssh-add and ssh-keygen; every agent a test starts is stopped by PID at teardown
(and checked gone).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from formats.sshsig import SshPublicKey, SshSignature
from tests.helpers import short_tmpdir
from workers.agents.ssh import SshAgent, SshAgentConnection, SshAgentError


def require_tools() -> None:
    """These tests need OpenSSH: fail loudly, never skip."""
    missing = [t for t in ("ssh-agent", "ssh-add", "ssh-keygen") if not shutil.which(t)]
    if missing:
        pytest.fail(f"required tools missing: {', '.join(missing)}")


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def base() -> Iterator[Path]:
    require_tools()
    path = short_tmpdir("sa")
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def keys() -> Iterator[dict[str, Path]]:
    """An unencrypted ed25519 key and a passphrase-protected one."""
    require_tools()
    path = short_tmpdir("sak")
    os.chmod(path, 0o700)
    for name, passphrase in (("plain", ""), ("protected", "secret")):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", name, "-f", name],
            cwd=path,
            check=True,
            stdin=subprocess.DEVNULL,
        )
    yield {"plain": path / "plain", "protected": path / "protected"}
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agents(base: Path) -> Iterator[list[SshAgent]]:
    """Agents made by a test; all stopped at teardown and checked gone by PID."""
    made: list[SshAgent] = []
    yield made
    for agent in made:
        pid = agent._pid
        agent.stop()
        if pid is not None:
            assert not alive(pid)


def new_agent(base: Path, agents: list[SshAgent], name: str = "h") -> SshAgent:
    home = base / name
    home.mkdir(mode=0o700)
    agent = SshAgent(home)
    agents.append(agent)
    agent.start()
    return agent


def test_lifecycle_by_pid(base: Path, agents: list[SshAgent]) -> None:
    agent = new_agent(base, agents)
    pid = agent.pid
    assert alive(pid) and agent.running
    assert b"ssh-agent" in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert agent.socket_path.is_socket()
    assert agent.socket_path.parent == agent.home
    with pytest.raises(SshAgentError, match="already started"):
        agent.start()
    agent.stop()
    assert not alive(pid)
    assert not agent.running
    assert not agent.socket_path.exists()
    with pytest.raises(SshAgentError, match="not running"):
        _ = agent.pid
    with pytest.raises(SshAgentError, match="not started"):
        agent.connect()
    agent.stop()  # idempotent


def test_context_manager_stops(base: Path) -> None:
    require_tools()
    home = base / "cm"
    home.mkdir(mode=0o700)
    agent = SshAgent(home)
    try:
        with agent:
            pid = agent.pid
            assert alive(pid)
    finally:
        agent.stop()
    assert not alive(pid)


def test_list_identities_shows_added_key(
    base: Path, agents: list[SshAgent], keys: dict[str, Path]
) -> None:
    agent = new_agent(base, agents)
    with agent.connect() as conn:
        assert conn.list_identities() == []
    key = agent.add_key(keys["plain"])
    expected = SshPublicKey.from_line(keys["plain"].with_suffix(".pub").read_text())
    assert key == expected  # blob and comment
    with agent.connect() as conn:
        assert conn.list_identities() == [expected]
        signature = SshSignature.from_armored(conn.sshsig(key, b"m", "stampd"))
    assert signature.public_key.blob == key.blob
    assert signature.namespace == "stampd"


def test_several_signatures_in_one_round_trip(
    base: Path, agents: list[SshAgent], keys: dict[str, Path]
) -> None:
    """sign_many answers as sign does (Ed25519 signatures are deterministic); a refused
    request within a batch raises once every answer is read: the connection stays usable."""
    agent = new_agent(base, agents)
    key = agent.add_key(keys["plain"])
    datas = [b"message %d" % i for i in range(5)]
    with agent.connect() as conn:
        assert conn.sign_many(key.blob, datas) == [conn.sign(key.blob, d) for d in datas]
        assert conn.sign_many(key.blob, []) == []
        other = SshPublicKey.from_line(keys["protected"].with_suffix(".pub").read_text())
        with pytest.raises(SshAgentError, match="refused"):
            conn.sign_many(other.blob, datas[:2])  # the agent has not got it: both refused
        assert conn.sign_many(key.blob, datas[:2]) == [conn.sign(key.blob, d) for d in datas[:2]]


def test_passphrase_protected_key_refused(
    base: Path, agents: list[SshAgent], keys: dict[str, Path]
) -> None:
    agent = new_agent(base, agents)
    with pytest.raises(SshAgentError, match="passphrase-protected"):
        agent.add_key(keys["protected"])
    with pytest.raises(SshAgentError, match="cannot read SSH key"):
        agent.add_key(base / "missing")
    with agent.connect() as conn:
        assert conn.list_identities() == []


def test_sign_after_sigkill_fails_without_waiting(
    base: Path, agents: list[SshAgent], keys: dict[str, Path]
) -> None:
    agent = new_agent(base, agents)
    key = agent.add_key(keys["plain"])
    conn = agent.connect()
    assert conn.timeout == 30.0
    conn.sshsig(key, b"before", "git")
    os.kill(agent.pid, signal.SIGKILL)
    with pytest.raises(SshAgentError) as failure:
        conn.sshsig(key, b"after", "git")
    # The dead agent is noticed from the socket (EOF, reset, broken pipe), not by timing out.
    assert "no answer within" not in str(failure.value)
    assert conn.closed
    with pytest.raises(SshAgentError, match="unusable"):
        conn.list_identities()
    pid = agent.pid
    # A dying agent may still accept a connection for a moment; once reaped, connect() says so.
    deadline = time.monotonic() + 5
    while agent.running and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(SshAgentError, match="died"):
        agent.connect()
    agent.stop()  # reaps the killed agent and removes the socket it left behind
    assert not alive(pid)
    assert not agent.socket_path.exists()


def test_stop_closes_open_connections(
    base: Path, agents: list[SshAgent], keys: dict[str, Path]
) -> None:
    agent = new_agent(base, agents)
    conn = agent.connect()
    agent.stop()
    assert conn.closed
    with pytest.raises(SshAgentError):
        conn.list_identities()


def test_stale_socket_is_replaced_and_live_one_refused(base: Path, agents: list[SshAgent]) -> None:
    home = base / "stale"
    home.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(home / "agent.sock"))
    stale.close()  # the socket file stays, nobody listens
    agent = SshAgent(home)
    agents.append(agent)
    agent.start()
    assert alive(agent.pid)
    second = SshAgent(home)
    agents.append(second)
    with pytest.raises(SshAgentError, match="already listens"):
        second.start()
    assert alive(agent.pid)


def test_home_must_be_private_and_short(base: Path) -> None:
    require_tools()
    open_home = base / "open"
    open_home.mkdir(mode=0o755)
    os.chmod(open_home, 0o755)
    with pytest.raises(SshAgentError, match="private"):
        SshAgent(open_home).start()
    with pytest.raises(SshAgentError, match="unusable"):
        SshAgent(base / "absent").start()
    long_home = base / ("x" * 100)
    long_home.mkdir(mode=0o700)
    with pytest.raises(SshAgentError, match="longer than"):
        SshAgent(long_home).start()


def test_missing_agent_program(base: Path) -> None:
    home = base / "np"
    home.mkdir(mode=0o700)
    with pytest.raises(SshAgentError, match="cannot start"):
        SshAgent(home, ssh_agent=str(base / "no-such-agent")).start()


def test_silent_agent_times_out(base: Path) -> None:
    """A peer that accepts but never answers: the request gives up after its timeout."""
    path = base / "silent.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    accepted: list[socket.socket] = []
    acceptor = threading.Thread(target=lambda: accepted.append(server.accept()[0]))
    acceptor.start()
    try:
        conn = SshAgentConnection.open(path, timeout=0.3)
        with pytest.raises(SshAgentError, match="no answer within"):
            conn.list_identities()
        assert conn.closed
    finally:
        acceptor.join(5)
        for sock in [*accepted, server]:
            with contextlib.suppress(OSError):
                sock.close()


def test_garbage_answer_breaks_connection(base: Path) -> None:
    """A peer that answers with an impossible length: a protocol error, not a hang."""
    path = base / "garbage.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def answer() -> None:
        peer, _ = server.accept()
        with peer:
            peer.recv(1024)
            peer.sendall(b"\xff\xff\xff\xff")

    responder = threading.Thread(target=answer)
    responder.start()
    try:
        conn = SshAgentConnection.open(path, timeout=5)
        with pytest.raises(SshAgentError, match="bad message length"):
            conn.list_identities()
        assert conn.closed
    finally:
        responder.join(5)
        server.close()
