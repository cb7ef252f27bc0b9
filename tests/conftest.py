"""Shared fixtures: real servers as subprocesses, a fixed test key, the local PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
TEST_SECRET_KEY = DATA / "test-secret-key.asc"
TEST_PUBLIC_KEY = DATA / "test-pubkey.asc"
TEST_FPR = "474CDCD4B9FAC83751047AD207C6AAE46E9FC8C9"
TEST_UID = "stampd Test Key <test@stampd.invalid>"
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def short_tmpdir(prefix: str) -> Path:
    """A directory with a short path (Unix socket paths are limited to 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def seed_data_dir(data_dir: Path) -> Path:
    """A data directory holding the fixed test key (so no key is generated)."""
    keys = data_dir / "keys"
    keys.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.copy(TEST_SECRET_KEY, keys / "secret-key.asc")
    os.chmod(keys / "secret-key.asc", 0o600)
    shutil.copy(TEST_PUBLIC_KEY, keys / "pubkey.asc")
    return data_dir


def pids_mentioning(needle: str) -> list[int]:
    """PIDs of processes whose command line mentions ``needle`` (left-over agents, workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if needle.encode() in cmdline:
            found.append(int(entry.name))
    return found


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    runtime_dir: Path
    log_path: Path
    workers: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def get_json(self, path: str) -> tuple[int, dict[str, object]]:
        try:
            with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def wait_ready(self, workers: int | None = None, timeout: float = 90) -> None:
        want = self.workers if workers is None else workers
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stampd exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError, ValueError):
                status, body = self.get_json("/readyz")
                if status == 200 and len(body.get("workers", [])) >= want:  # type: ignore[arg-type]
                    return
            time.sleep(0.1)
        raise RuntimeError(f"stampd not ready after {timeout}s:\n{self.log()}")

    def worker_pids(self) -> list[int]:
        return [p for p in pids_mentioning("workers.worker") if self._ours(p)]

    def agent_pids(self) -> list[int]:
        return [p for p in pids_mentioning(str(self.runtime_dir))
                if b"gpg-agent" in _cmdline(p) or b"ssh-agent" in _cmdline(p)]

    def _ours(self, pid: int) -> bool:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return f"STAMPD_RUNTIME_DIR={self.runtime_dir}".encode() in environ

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-6000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then SIGKILL; then kill by PID anything of ours that is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        code = self.proc.returncode
        self.reap_leftovers()
        return code

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def reap_leftovers(self, grace: float = 5.0) -> list[int]:
        """Give orphaned workers/agents a moment to exit on their own, then kill them."""
        deadline = time.monotonic() + grace
        left: list[int] = []
        while time.monotonic() < deadline:
            left = self.worker_pids() + self.agent_pids() + [
                p for p in pids_mentioning("workers.pool") if self._ours(p)]
            if not left:
                return []
            time.sleep(0.1)
        kill_pids(left)
        return left


def start_server(
    data_dir: Path,
    *,
    workers: int = 2,
    commit_interval: float = 3600,
    database_url: str | None = None,
    extra_env: dict[str, str] | None = None,
    wait: bool = True,
    port: int | None = None,
    runtime_dir: Path | None = None,
) -> Server:
    port = port or free_port()
    runtime = runtime_dir or short_tmpdir("sr")
    env = dict(os.environ)
    env.update({
        "STAMPD_RUNTIME_DIR": str(runtime),
        "STAMPD_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "server", "serve", "--port", str(port),
           "--data-dir", str(data_dir), "--workers", str(workers),
           "--commit-interval", str(commit_interval)]
    if database_url:
        cmd += ["--database-url", database_url]
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / f"server-{port}.log"
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT)
    server = Server(proc, port, data_dir, runtime, log_path, workers, env)
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
    return server


@pytest.fixture
def seeded_dir(tmp_path: Path) -> Path:
    return seed_data_dir(tmp_path / "data")


@pytest.fixture
def server_factory() -> Iterator[list[Server]]:
    """Start servers with `start_server`; append them here so that they are stopped."""
    servers: list[Server] = []
    yield servers
    for s in servers:
        s.stop()
        shutil.rmtree(s.runtime_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server with the test key and 2 workers, shared by a module's tests."""
    data = seed_data_dir(tmp_path_factory.mktemp("live") / "data")
    server = start_server(data, workers=2)
    yield server
    server.stop()
    shutil.rmtree(server.runtime_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def other_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second stampd with a freshly generated key but the test key's user id: its stamps
    look right and are signed by the wrong key."""
    data = tmp_path_factory.mktemp("other") / "data"
    server = start_server(data, workers=1, extra_env={"STAMPD_KEY_UID": TEST_UID})
    yield server
    server.stop()
    shutil.rmtree(server.runtime_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh database on the local PostgreSQL; fails (never skips) when it is missing."""
    import psycopg

    name = f"stampd_test_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as e:
        pytest.fail(f"PostgreSQL on 127.0.0.1:5432 is required for this test: {e}")
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                   ) -> None:
    """Tests never touch the user's ~/.gnupg or ~/.gitconfig (the git-timestamp client writes
    its trust-on-first-use key id into the global git config)."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("GNUPGHOME", raising=False)


@pytest.fixture(autouse=True)
def _stop_stray_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """gpg starts agents on its own (e.g. on import into a verifying keyring); after each test,
    stop by PID every gpg-agent whose home lies in this session's temporary directories."""
    yield
    base = str(tmp_path_factory.getbasetemp())
    kill_pids([p for p in pids_mentioning(base)
               if b"gpg-agent" in _cmdline(p)])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
