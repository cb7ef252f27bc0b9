"""Helpers shared by the test modules (fixtures live in tests/conftest.py).

Servers as subprocesses, the fixed test key, gpg/git verification of stamps, a small load
generator, the public log and peer branches, and generated OpenPGP test keys.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import functools
import http.client
import http.server
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pygit2

from formats.jobs import Job
from formats.keys import PRIMARY
from formats.openpgp import PK_DSA, PK_ECDSA, PK_EDDSA, PK_RSA
from procs.forked import Forked, stop_child
from server.dispatch import Signed
from server.errors import Unavailable
from tests.forkserver import startup_variable
from workers.pool import POOL_NAME
from workers.signer import OpenPgpSigner
from workers.worker import WORKER_NAME

if TYPE_CHECKING:
    from workers.agents.gpg import GpgAgent

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
TEST_SECRET_KEY = DATA / "test-secret-key.asc"
TEST_PUBLIC_KEY = DATA / "test-pubkey.asc"
TEST_FPR = "474CDCD4B9FAC83751047AD207C6AAE46E9FC8C9"
TEST_UID = "stampd Test Key <test@stampd.invalid>"


# ---------------------------------------------------------------------------------------------
# Processes, ports and servers


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A loopback port free now, for a server a test starts next, chosen below the kernel's
    ephemeral range: a port the kernel gave out as free (bind to 0) may be taken by the source
    port of any outgoing connection before the server binds it, and the suite makes thousands
    (a module's server once failed with "address already in use")."""
    low = _ephemeral_low()
    for _ in range(200):
        port = secrets.randbelow(low - 10_000) + 10_000
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # (no free port below the range: take the kernel's)
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def agent_home(prefix: str) -> Iterator[Path]:
    """A short private (0700) home for agents a test starts; fails the test if an agent is
    still running in it at the end, then removes it."""
    path = short_tmpdir(prefix)
    os.chmod(path, 0o700)
    yield path
    left = [p for p in pids_mentioning(str(path)) if b"agent" in proc_cmdline(p)]
    shutil.rmtree(path, ignore_errors=True)
    assert left == [], f"an agent was left running in {path}: {left}"


def short_tmpdir(prefix: str) -> Path:
    """A directory with a short path (Unix socket paths are limited to 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


SHARED_DIR: Path | None = None  # the run's directory under pytest -n (tests/conftest.py)


@functools.cache
def migrated_journal() -> Path:
    """An empty SQLite journal at the newest schema revision, made once per run under
    ``pytest -n`` (by the first test process that needs it, under a lock, in the run's
    directory `SHARED_DIR`, which the controlling process removes), else once per test
    process. Seeded data directories start from a copy, so that their servers skip the
    migrations (tests/integration/test_journal.py runs them; unseeded directories still do)."""
    if SHARED_DIR is None:
        home = tempfile.mkdtemp(prefix="stampd-journal-")
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        return _migrated(Path(home))
    import fcntl

    shared = SHARED_DIR / "stampd.sqlite3"
    with open(SHARED_DIR / "journal.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        if not shared.exists():
            with tempfile.TemporaryDirectory(prefix="journal-", dir=SHARED_DIR) as home:
                os.replace(_migrated(Path(home)), shared)
    return shared


def _migrated(home: Path) -> Path:
    """``home``/stampd.sqlite3, migrated to the newest revision."""
    from server import db

    path = home / "stampd.sqlite3"
    engine = db.make_engine(f"sqlite:///{path}")
    try:
        db.upgrade(engine)
    finally:
        engine.dispose()
    return path


def migrated_sqlite(path: Path) -> str:
    """The URL of a SQLite journal at ``path`` at the newest schema revision: a copy of
    `migrated_journal` (a test that needs a migrated journal, not the migrations themselves,
    spares their 0.1 s of CPU: the integration tests ran them 132 times a run, now 29)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(migrated_journal(), path)
    return f"sqlite:///{path}"


def seed_data_dir(data_dir: Path, secret: Path = TEST_SECRET_KEY,
                  public: Path = TEST_PUBLIC_KEY) -> Path:
    """A data directory holding a primary key (by default the fixed test key), so that no key
    is generated, and an empty, migrated journal."""
    keys = data_dir / "keys"
    keys.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.copy(secret, keys / "secret-key.asc")
    os.chmod(keys / "secret-key.asc", 0o600)
    shutil.copy(public, keys / "pubkey.asc")
    if not (data_dir / "stampd.sqlite3").exists():
        shutil.copy(migrated_journal(), data_dir / "stampd.sqlite3")
    return data_dir


def cmdlines() -> dict[int, bytes]:
    """Every other process's command line, its arguments joined by spaces."""
    # (plain open() and no pathlib: half the CPU of Path.read_bytes for the few hundred
    # processes of a whole run, read after every module and server)
    found = {}
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = f.read().replace(b"\0", b" ")
        except OSError:
            continue
    return found


def pids_mentioning(needle: str, table: dict[int, bytes] | None = None) -> list[int]:
    """PIDs of processes whose command line mentions ``needle`` (left-over agents, workers),
    in ``table`` (`cmdlines`) when given, else in a fresh look at every process."""
    want = needle.encode()
    return [pid for pid, cmdline in (cmdlines() if table is None else table).items()
            if want in cmdline]


class RoutesServer:
    """A local HTTP server answering GETs from ``routes`` (path, less the query → status, body,
    headers), 404 and no body for any other path; ``routes`` may change while it serves."""

    def __init__(self, routes: dict[str, tuple[int, bytes, dict[str, str]]]) -> None:
        self.routes = table = routes

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body, headers = table.get(self.path.split("?")[0], (404, b"", {}))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Relay:
    """A loopback HTTP server in front of a real one, for tests of what a client does with a
    wrong answer: ``route(method, path, body)`` makes the request sent on for each GET or
    POST received, and its answer (status and body) goes back as it is."""

    def __init__(self, route: Callable[[str, str, bytes | None], urllib.request.Request]) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.relay(None)

            def do_POST(self) -> None:
                self.relay(self.rfile.read(int(self.headers["Content-Length"])))

            def relay(self, body: bytes | None) -> None:
                try:
                    with urllib.request.urlopen(route(self.command, self.path, body),
                                                timeout=30) as r:
                        status, data = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


class Process(Protocol):
    """What tests use of a process they started: a `subprocess.Popen` or a `ForkedProcess`."""

    pid: int
    returncode: int | Any

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class ForkServer:
    """tests/forkserver.py for this test process: started at its first use, stopped (by PID)
    by `close` (the session fixture ``fork_server`` in tests/conftest.py); or, given ``path``,
    the one of the whole ``pytest -n`` run listening there (started and stopped by the
    controlling process), connected to at the first use."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.sock: socket.socket | None = None
        self.file: Any = None
        self.lock = threading.Lock()
        self.failed = False

    def _start(self) -> None:
        if self.path is not None:
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(self.path))
            self.sock, self.file = sock, sock.makefile("rwb")
            self.file.write(b'{"env": 1}\n')
            self.file.flush()
            self.env = dict(json.loads(self.file.readline())["env"])
            return
        ours, theirs = socket.socketpair()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.forkserver", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, cwd=ROOT, env=self.env)
        self.sock, self.file = ours, ours.makefile("rwb")

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if self.file is None:
                self._start()
            self.file.write(json.dumps(request).encode() + b"\n")
            self.file.flush()
            line = self.file.readline()
        if not line:
            raise RuntimeError("tests.forkserver exited (see the test output)")
        return dict(json.loads(line))

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a server with ``env`` can be forked: the variables read when Python starts
        are the fork server's."""
        if self.failed:
            return False
        if self.path is not None and self.file is None:
            with self.lock:
                try:
                    if self.file is None:
                        self._start()
                except (OSError, ValueError, KeyError):
                    self.failed = True
                    return False
        ours = self.env or {**os.environ, "PYTHONUNBUFFERED": "1"}
        return all(env.get(k) == ours.get(k) for k in {*env, *ours} if startup_variable(k))

    def start(self, args: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT,
              **files: Path) -> ForkedProcess:
        """Fork ``python -m stampd ARGS``; its output goes to ``log``, or to the files
        ``stdout`` and ``stderr`` given, its input comes from ``stdin`` given, else
        /dev/null."""
        try:
            pid = int(self.call({"start": {"args": args, "env": env, "cwd": str(cwd),
                                           "log": str(log),
                                           **{k: str(v) for k, v in files.items()}}})["pid"])
        except BaseException:
            self.failed = True
            raise
        return ForkedProcess(self, pid, args)

    def close(self) -> None:
        with self.lock:
            if self.file is not None:
                self.file.close()
                assert self.sock is not None
                self.sock.close()
                self.file = self.sock = None
            if self.proc is not None:
                terminate(self.proc, 10)  # (it exits when the socket closes)
                self.proc = None


FORK_SERVER: ForkServer | None = None  # set by tests/conftest.py for pytest's processes


def run_stampd(args: Sequence[str | Path], *, env: Mapping[str, str] | None = None,
               cwd: Path = ROOT, timeout: float = 60, input: str | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """``python -m stampd ARGS`` run to its end, as ``subprocess.run(..., capture_output=True,
    text=True)`` runs it: forked from the test process's fork server where the environment
    fits (tests/forkserver.py: 0.3-0.9 s of CPU less a run), else started."""
    full = {"PYTHONUNBUFFERED": "1", **(os.environ if env is None else env)}  # (as serve's)
    argv = [sys.executable, "-m", "stampd", *map(str, args)]
    server = FORK_SERVER
    if server is None or not server.fits(full):
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env=full, input=input, check=False)
    with tempfile.TemporaryDirectory(prefix="stampd-run-") as tmp:
        out, err, given = Path(tmp, "out"), Path(tmp, "err"), Path(tmp, "in")
        given.write_text(input or "")
        proc = server.start(argv[3:], full, out, cwd, stdout=out, stderr=err, stdin=given)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
        return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())


class ForkedProcess(Forked):
    """A server forked by `ForkServer`, with what tests use of a `subprocess.Popen` (the fork
    server is its parent, and waits for it when asked)."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        super().__init__(pid, args)
        self.server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.call({"poll": self.pid})["status"]
        return self.returncode

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def terminate(proc: Process, timeout: float = 30) -> int:
    """Stop a process we started: SIGTERM, SIGKILL after ``timeout`` seconds (as stampd stops
    its own children); its exit status."""
    stop_child(proc, timeout)
    return int(proc.returncode)


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def proc_cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def proc_names() -> dict[int, tuple[str, int]]:
    """Every process's name (``/proc/PID/comm``) and parent PID."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        comm, _, rest = stat.partition(" (")[2].rpartition(") ")
        found[int(name)] = (comm, int(rest.split()[1]))
    return found


HTTP_MANAGER = "stampd-api"  # (server.http_processes: the names it gives)
STARTED_WORKER = re.compile(r"started worker \d+ \(pid (\d+), key (\S+), home ")  # (workers.pool)
HTTP_PROCESS = re.compile(r"stampd-http-\d+")


@dataclass
class Server:
    proc: Process
    port: int
    data_dir: Path
    runtime_dir: Path
    log_path: Path
    workers: int
    env: dict[str, str] = field(default_factory=dict)
    api_processes: int = 1  # (--api-processes)
    http_seen: set[int] = field(default_factory=set)  # (see http_tree)
    signers_seen: set[int] = field(default_factory=set)  # (see signing_tree)

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
        in_a_row = 0  # several HTTP processes: each answer comes from one of them
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stampd exited with {self.proc.returncode}:\n{self.log()}")
            ok = False
            with contextlib.suppress(OSError, ValueError):
                status, body = self.get_json("/readyz")
                ok = status == 200 and len(body.get("workers", [])) >= want  # type: ignore[arg-type]
            in_a_row = in_a_row + 1 if ok else 0
            if in_a_row >= (4 if self.api_processes > 1 else 1):
                self.signing_tree()  # (seen now: found again if orphaned by a kill)
                return
            time.sleep(0.1)
        raise RuntimeError(f"stampd not ready after {timeout}s:\n{self.log()}")

    def worker_keys(self, workers: Sequence[int]) -> dict[int, str]:
        """The key of each of ``workers`` (those the log names): forked, they have their
        supervisor's command line; the supervisor's INFO line that started each names its PID
        and key (the newest line for a PID counts)."""
        key_of = {int(m[1]): m[2] for m in STARTED_WORKER.finditer(self.log_path.read_text())}
        return {p: key_of[p] for p in workers if p in key_of}

    def key_workers(self, key_id: str) -> list[int]:
        """The live workers of the key ``key_id``."""
        return [p for p, key in self.worker_keys(self.worker_pids()).items() if key == key_id]

    def worker_pids(self, names: dict[int, tuple[str, int]] | None = None) -> list[int]:
        """The server's workers (`signing_tree`), in ``names`` (`proc_names`) when given."""
        return self.signing_tree(names)[1]

    def signing_tree(self, names: dict[int, tuple[str, int]] | None = None
                     ) -> tuple[list[int], list[int]]:
        """The server's worker supervisors and workers. Forked (the supervisor by ``stampd
        serve``, the workers by the supervisor), they keep the command line and environment
        of the process first started, here often the fork server's, so they are told apart by
        name (`POOL_NAME`, `WORKER_NAME`) and parent: a supervisor is a child of ``proc``, a
        worker a child of a supervisor (or of ``proc``: ``stampd worker``); or one seen
        before, alive under that name (orphaned when its parent died); or one whose
        environment names this server's runtime directory (started anew by a supervisor
        that had threads)."""
        names = proc_names() if names is None else names
        self.signers_seen &= set(names)  # (the dead: their PIDs may be another's next)
        root = self.proc.pid
        pools = {p for p, (comm, parent) in names.items() if comm == POOL_NAME and (
            parent == root or p in self.signers_seen or self._ours(p))}
        workers = {p for p, (comm, parent) in names.items() if comm == WORKER_NAME and (
            parent in pools or parent == root or p in self.signers_seen or self._ours(p))}
        self.signers_seen |= pools | workers
        return sorted(pools), sorted(workers)

    def http_pids(self) -> list[int]:
        """The HTTP processes of a server with several (none with one: it is ``proc``)."""
        names = proc_names()
        return [p for p in self.http_tree(names) if names[p][0] != HTTP_MANAGER]

    def http_tree(self, names: dict[int, tuple[str, int]] | None = None) -> list[int]:
        """The HTTP manager and processes of a server with several: forked, they have the
        server's command line and environment, but names of their own. The manager is the
        child of ``proc`` named stampd-api, the HTTP processes its children named
        stampd-http-N; and those seen before that still live under those names (orphaned
        when the server died)."""
        names = proc_names() if names is None else names
        managers = {p for p, (comm, parent) in names.items() if comm == HTTP_MANAGER
                    and (parent == self.proc.pid or p in self.http_seen)}
        http = {p for p, (comm, parent) in names.items() if HTTP_PROCESS.fullmatch(comm)
                and (parent in managers or p in self.http_seen)}
        self.http_seen |= managers | http
        return sorted(managers | http)

    def agent_pids(self, table: dict[int, bytes] | None = None) -> list[int]:
        table = cmdlines() if table is None else table
        return [p for p in pids_mentioning(str(self.runtime_dir), table)
                if b"gpg-agent" in table[p] or b"ssh-agent" in table[p]]

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
        code = terminate(self.proc, timeout)
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
            names, table = proc_names(), cmdlines()  # (one look of each kind for all)
            pools, workers = self.signing_tree(names)
            left = workers + self.agent_pids(table) + self.http_tree(names) + pools
            if not left:
                return []
            time.sleep(0.1)
        kill_pids(left)
        return left


def start_stampd(args: Sequence[str | Path], env: dict[str, str], log: Path,
                 stderr_only: bool = False) -> Process:
    """``python -m stampd ARGS`` in the background, in ROOT, its output appended to ``log``
    (with ``stderr_only``, stderr alone: stdout goes to /dev/null): forked from the test
    process's fork server where the environment fits (about a second of CPU less;
    tests/forkserver.py), else started."""
    argv = [str(a) for a in args]
    if FORK_SERVER is not None and FORK_SERVER.fits(env):
        log.touch()
        if stderr_only:
            return FORK_SERVER.start(argv, env, log, stdout=Path(os.devnull), stderr=log)
        return FORK_SERVER.start(argv, env, log)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "stampd", *argv], env=env,
                                stdout=subprocess.DEVNULL if stderr_only else out,
                                stderr=out if stderr_only else subprocess.STDOUT, cwd=ROOT)


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
    args: tuple[str, ...] = (),
    api_processes: int = 1,
) -> Server:
    """``stampd serve`` on loopback with ``data_dir`` (and ``args``, e.g. ``--no-workers``)
    and ``api_processes`` HTTP processes."""
    port = port or free_port()
    runtime = runtime_dir or short_tmpdir("sr")
    env = dict(os.environ)
    env.update({
        "STAMPD_RUNTIME_DIR": str(runtime),
        "STAMPD_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        # RFC 3161 (on by default) adds a key, a worker and an agent to a server: the servers
        # of tests and benchmarks run without it unless they turn it on (tests/system/test_tsa).
        "STAMPD_TSA": os.environ.get("STAMPD_TSA", "false"),
        # The transparency log's key likewise (on by default; off unless a test turns it on).
        "STAMPD_TLOG": os.environ.get("STAMPD_TLOG", "off"),
    })
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "stampd", "serve", "--port", str(port),
           "--data-dir", str(data_dir), "--workers", str(workers),
           "--commit-interval", str(commit_interval), "--api-processes", str(api_processes),
           *args]
    if database_url:
        cmd += ["--database-url", database_url]
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / f"server-{port}.log"
    proc = start_stampd(cmd[3:], env, log_path)
    server = Server(proc, port, data_dir, runtime, log_path, workers, env, api_processes)
    if wait:
        try:
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
    return server


# ---------------------------------------------------------------------------------------------
# Verification of stamps with the real gpg and git binaries

SIG_BEGIN = "-----BEGIN PGP SIGNATURE-----"


def keyring(pubkey: Path | str, home: Path, *, agent: bool = False) -> Path:
    """A GNUPGHOME at ``home`` holding (and trusting nothing but) ``pubkey``, where gpg starts
    no agent (importing and checking public keys needs none; each agent started cost 25 ms of
    CPU): unless ``agent`` (a secret key, to sign with in that home)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not agent:
        with open(home / "gpg.conf", "a") as conf:
            conf.write("no-autostart\n")
    r = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--status-fd", "1",
                        "--import", str(pubkey)], capture_output=True, timeout=60, check=False)
    # gpg exits 2 after a good import when it cannot reach an agent (long paths).
    assert b"IMPORT_OK" in r.stdout, r.stderr
    return home


@dataclass
class Verified:
    fingerprint: str
    created: int


def verify_detached(payload: bytes, signature: str, home: Path) -> Verified:
    """`gpg --verify` a detached armored signature; raise AssertionError unless VALIDSIG."""
    with tempfile.NamedTemporaryFile("w", suffix=".asc", delete=False) as f:
        f.write(signature)
        sig_path = f.name
    try:
        r = subprocess.run(
            ["gpg", "--homedir", str(home), "--batch", "--status-fd", "1", "--verify",
             sig_path, "-"],
            input=payload, capture_output=True, timeout=60, check=False,
        )
    finally:
        Path(sig_path).unlink()
    status = r.stdout.decode()
    m = re.search(r"^\[GNUPG:\] VALIDSIG (\S+) \S+ (\d+) ", status, re.MULTILINE)
    assert r.returncode == 0 and m, f"gpg --verify failed: {status}\n{r.stderr.decode()}"
    return Verified(fingerprint=m.group(1), created=int(m.group(2)))


def split_tag(text: str) -> tuple[bytes, str]:
    pos = text.rindex("\n" + SIG_BEGIN + "\n") + 1
    return text[:pos].encode(), text[pos:]


def split_commit(text: str) -> tuple[bytes, str]:
    m = re.search(
        r"^gpgsig(?:-sha256)? (-----BEGIN PGP SIGNATURE-----\n(?: .*\n)+?) "
        r"-----END PGP SIGNATURE-----\n",
        text, re.MULTILINE,
    )
    assert m, "no gpgsig header"
    sig = (m.group(1) + " -----END PGP SIGNATURE-----\n").replace("\n ", "\n")
    payload = text[: m.start()] + text[m.end():]
    return payload.encode(), sig


def verify_stamp(text: str, home: Path) -> Verified:
    if text.startswith("object "):
        payload, sig = split_tag(text)
    else:
        payload, sig = split_commit(text)
    assert text.count(SIG_BEGIN) == 1, "exactly one signature"
    return verify_detached(payload, sig, home)


def _signed_message(payload: bytes, armored: str) -> bytes:
    """An OpenPGP signed message (RFC 4880 11.3: a signature packet, then a literal data
    packet holding ``payload``) from a detached binary signature: what ``gpg --verify-files``
    checks, several in one gpg process. The signature is over the literal data's contents, as
    the detached one is over the payload."""
    lines = armored.strip().splitlines()
    body = [ln for ln in lines[lines.index("") + 1: -1] if not ln.startswith("=")]
    sig = base64.b64decode("".join(body))
    literal = b"b\x00\x00\x00\x00\x00" + payload  # binary, no file name, no date
    n = len(literal)
    header = bytes([0xC0 | 11, 0xFF]) + n.to_bytes(4, "big")  # new format, 5-byte length
    return sig + header + literal


def verify_stamps(texts: list[str], home: Path, batch: int = 200) -> list[Verified]:
    """`verify_stamp` for many stamps, with one gpg process per ``batch`` of them: each stamp
    must have exactly one signature, and gpg must report a good signature (VALIDSIG) for every
    one of them, in order."""
    out: list[Verified] = []
    for start in range(0, len(texts), batch):
        chunk = texts[start:start + batch]
        with tempfile.TemporaryDirectory(prefix="vs", dir="/tmp") as tmp:
            files = []
            for i, text in enumerate(chunk):
                assert text.count(SIG_BEGIN) == 1, "exactly one signature"
                payload, sig = split_tag(text) if text.startswith("object ") else \
                    split_commit(text)
                files.append(Path(tmp) / f"{i}.gpg")
                files[-1].write_bytes(_signed_message(payload, sig))
            r = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--status-fd", "1",
                                "--verify-files", *map(str, files)],
                               capture_output=True, timeout=120, check=False)
        status = r.stdout.decode()
        valid = re.findall(r"^\[GNUPG:\] VALIDSIG (\S+) \S+ (\d+) ", status, re.MULTILINE)
        bad = re.findall(r"^\[GNUPG:\] (BADSIG|ERRSIG|NODATA)", status, re.MULTILINE)
        assert r.returncode == 0 and not bad and len(valid) == len(chunk), (
            f"gpg --verify-files: {len(valid)} of {len(chunk)} good: {status[-2000:]}")
        out += [Verified(fingerprint=f, created=int(t)) for f, t in valid]
    return out


def stamp_time(text: str) -> int:
    m = re.search(r"^(?:tagger|committer) .* (\d+) \+0000$", text, re.MULTILINE)
    assert m, "no tagger/committer line"
    return int(m.group(1))


# ---------------------------------------------------------------------------------------------
# A small threaded load generator for fault tests (benchmarks use wrk, see bench/)


@dataclass
class Result:
    commit: str
    status: int  # 0 = connection failed
    text: str


@dataclass
class Load:
    port: int
    clients: int
    per_client: int
    kind: str = "tag"
    results: list[Result] = field(default_factory=list)
    done: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        for _ in range(self.per_client):
            if self.stop.is_set():
                return
            commit = secrets.token_hex(20)
            fields = {"request": "stamp-tag-v1", "commit": commit, "tagname": "load"}
            if self.kind == "branch":
                fields = {"request": "stamp-branch-v1", "commit": commit,
                          "tree": secrets.token_hex(20)}
            try:
                conn.request("POST", "/", body=urllib.parse.urlencode(fields),
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
                r = conn.getresponse()
                res = Result(commit, r.status, r.read().decode())
            except (OSError, http.client.HTTPException) as e:
                res = Result(commit, 0, repr(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            with self._lock:
                self.results.append(res)
            self.done.release()
        conn.close()

    def run(self) -> ThreadPoolExecutor:
        pool = ThreadPoolExecutor(self.clients)
        for _ in range(self.clients):
            pool.submit(self._client)
        return pool

    def wait_done(self, n: int, timeout: float = 120) -> None:
        for _ in range(n):
            if not self.done.acquire(timeout=timeout):
                raise TimeoutError(f"load made no progress in {timeout}s")


# ---------------------------------------------------------------------------------------------
# Stamping over HTTP and the public log


def stamp_tag(server: Server, commit: str, tagname: str = "t") -> str:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = urllib.parse.urlencode({"request": "stamp-tag-v1", "commit": commit,
                                   "tagname": tagname})
    conn.request("POST", "/", body=body,
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    r = conn.getresponse()
    text = r.read().decode()
    assert r.status == 200, text
    return text


def log_commits(data_dir: Path) -> list[pygit2.Commit]:
    repo = pygit2.Repository(str(data_dir / "log.git"))
    try:
        head = repo.references["refs/heads/main"].target
    except KeyError:
        return []
    return list(repo.walk(head, pygit2.enums.SortMode.TOPOLOGICAL))


def logged_hashes(data_dir: Path) -> set[str]:
    hashes: set[str] = set()
    for c in log_commits(data_dir):
        blob = c.tree["hashes.log"]
        hashes.update(blob.data.decode().split())  # type: ignore[attr-defined]
    return hashes


def wait_for(predicate, timeout: float = 30, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# ---------------------------------------------------------------------------------------------
# git and the real `git timestamp` client (PyPI git-timestamp 1.2.2)

GIT_TIMESTAMP = Path(sys.executable).parent / "git-timestamp"
# The client imports `distutils.util` (for strtobool) and nothing else of it. In the venv,
# setuptools' distutils-precedence.pth makes that import load setuptools and pkg_resources:
# ~0.35 s of the ~0.7 s of CPU one client run costs (measured with `python -X importtime`), for
# each of the suite's few dozen runs. With "stdlib" the same import is Python 3.11's own
# distutils, whose strtobool is the same function; the client runs otherwise unchanged.
CLIENT_ENV = {"SETUPTOOLS_USE_DISTUTILS": "stdlib"}


def git(repo: Path, *args: str, env: dict[str, str] | None = None,
        input: str | None = None) -> str:
    r = subprocess.run(["git", *args], cwd=repo, input=input, capture_output=True, text=True,
                       timeout=60, env=env, check=False)
    assert r.returncode == 0, f"git {' '.join(args)}: {r.stdout}{r.stderr}"
    return r.stdout + r.stderr


def require_tools(*tools: str) -> None:
    """Fail the test (not skip it) when one of `tools` is not on PATH."""
    import pytest  # only the tests use this; the benches import this module without pytest

    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"required tools missing: {', '.join(missing)}")


def make_repo(path: Path, object_format: str = "sha1") -> Path:
    """A repository on branch main with one commit ("first", a.txt holding "hello")."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main", f"--object-format={object_format}")
    git(path, "config", "user.name", "Tester")
    git(path, "config", "user.email", "tester@example.invalid")
    (path / "a.txt").write_text("hello\n")
    git(path, "add", "a.txt")
    git(path, "commit", "-q", "-m", "first")
    return path


def client(repo: Path, gnupg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert GIT_TIMESTAMP.exists(), "git-timestamp (test dependency) is not installed"
    return subprocess.run([str(GIT_TIMESTAMP), "--gnupg-home", str(gnupg), *args], cwd=repo,
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **CLIENT_ENV})


# ---------------------------------------------------------------------------------------------
# Log branches and cross-stamping peers


def branch(data_dir: Path, name: str) -> list[pygit2.Commit]:
    """The commits of a log branch, newest first: main's history, or a stamp branch's chain of
    stamps (first parents while a commit has two parents; the last stamp may have one)."""
    repo = pygit2.Repository(str(data_dir / "log.git"))
    try:
        head = repo.references[f"refs/heads/{name}"].target
    except KeyError:
        return []
    if name == "main":
        return list(repo.walk(head, pygit2.enums.SortMode.TOPOLOGICAL))
    chain = [repo[head]]
    while len(chain[-1].parents) == 2:
        chain.append(chain[-1].parents[0])
    return chain  # type: ignore[return-value]


def cross_rows(data_dir: Path) -> list[tuple[str, str, int, str | None]]:
    with sqlite3.connect(data_dir / "stampd.sqlite3") as db:
        return db.execute("select peer, state, attempts, last_error from cross_stamps "
                          "order by id").fetchall()


def verify_commits(git_dir: Path, commits: list[pygit2.Commit], pubkey: Path,
                   home: Path) -> None:
    env = {**os.environ, "GNUPGHOME": str(keyring(pubkey, home))}
    for c in commits:
        r = subprocess.run(["git", "--git-dir", str(git_dir), "verify-commit", str(c.id)],
                           capture_output=True, text=True, env=env, timeout=60, check=False)
        assert r.returncode == 0, r.stderr


def cross_stamping_pair(tmp_path: Path, server_factory: list[Server], cycles: int
                        ) -> tuple[Server, Server, Path, Path]:
    """Servers a (test key) and b (its own key) stamping each other's log for ``cycles``
    log commits each; (a, b, a's data dir, b's data dir)."""
    a_dir = tmp_path / "a" / "data"
    b_dir = tmp_path / "b" / "data"  # b generates its own key on first start
    a_port, b_port = free_port(), free_port()
    a = start_server(seed_data_dir(a_dir), workers=1, commit_interval=2, port=a_port,
                     extra_env={"STAMPD_PEERS": f"bee=http://127.0.0.1:{b_port}/"},
                     api_processes=2)
    server_factory.append(a)
    b = start_server(b_dir, workers=1, commit_interval=2, port=b_port,
                     extra_env={"STAMPD_PEERS": f"ay=http://127.0.0.1:{a_port}/"})
    server_factory.append(b)
    for cycle in range(cycles):
        stamp_tag(a, f"{cycle + 1:040x}")
        stamp_tag(b, f"{cycle + 101:040x}")
        wait_for(lambda c=cycle: len(branch(a_dir, "bee-timestamps")) > c, timeout=30,  # type: ignore[misc]
                 what=f"b's stamp of a's log, cycle {cycle}")
        wait_for(lambda c=cycle: len(branch(b_dir, "ay-timestamps")) > c, timeout=30,  # type: ignore[misc]
                 what=f"a's stamp of b's log, cycle {cycle}")
    return a, b, a_dir, b_dir


# ---------------------------------------------------------------------------------------------
# OpenPGP test keys of every type GnuPG 2.2 signs with, generated by a real gpg

KEY_CREATED = "20200101T000000"  # keys predate every signature made here
PASSPHRASE = "correct horse %25 bättery staple"


@dataclass(frozen=True)
class KeyType:
    params: str  # gpg --gen-key parameters for the key
    algo: int
    bits: int
    curve: str | None
    order_bytes: int  # length of the group order (ECC, DSA q) or modulus (RSA)
    count: int  # signatures to make at least
    must_cover_short_value: bool  # sign until a value with a leading zero byte occurred


def _ecdsa(curve: str, bits: int, order_bytes: int, count: int = 200) -> KeyType:
    params = f"Key-Type: ECDSA\nKey-Curve: {curve}\n"
    return KeyType(params, PK_ECDSA, bits, curve, order_bytes, count, True)


KEY_TYPES: dict[str, KeyType] = {
    "ed25519": KeyType("Key-Type: EDDSA\nKey-Curve: ed25519\n", PK_EDDSA, 255, "ed25519", 32,
                       200, True),
    "rsa2048": KeyType("Key-Type: RSA\nKey-Length: 2048\n", PK_RSA, 2048, None, 256, 60, False),
    "rsa3072": KeyType("Key-Type: RSA\nKey-Length: 3072\n", PK_RSA, 3072, None, 384, 30, False),
    "rsa4096": KeyType("Key-Type: RSA\nKey-Length: 4096\n", PK_RSA, 4096, None, 512, 20, False),
    "nistp256": _ecdsa("nistp256", 256, 32),
    "nistp384": _ecdsa("nistp384", 384, 48),
    "nistp521": _ecdsa("nistp521", 521, 66, count=100),
    "brainpoolP256r1": _ecdsa("brainpoolP256r1", 256, 32),
    "brainpoolP384r1": _ecdsa("brainpoolP384r1", 384, 48),
    "brainpoolP512r1": _ecdsa("brainpoolP512r1", 512, 64, count=100),
    "secp256k1": _ecdsa("secp256k1", 256, 32),
    # GnuPG 2.2 makes DSA keys with a 256-bit q for both sizes.
    "dsa2048": KeyType("Key-Type: DSA\nKey-Length: 2048\n", PK_DSA, 2048, None, 32, 200, True),
    "dsa3072": KeyType("Key-Type: DSA\nKey-Length: 3072\n", PK_DSA, 3072, None, 32, 200, True),
}  # fmt: skip

EXTRA_KEYS: dict[str, str] = {
    "ed25519-protected": f"Key-Type: EDDSA\nKey-Curve: ed25519\nPassphrase: {PASSPHRASE}\n",
    "ed25519-subkey": (
        "Key-Type: EDDSA\nKey-Curve: ed25519\nKey-Usage: cert\n"
        "Subkey-Type: EDDSA\nSubkey-Curve: ed25519\nSubkey-Usage: sign\n"
    ),
}


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def run_gpg(home: Path, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    argv = ["gpg", "--homedir", str(home), "--batch", "--no-tty", "--no-autostart", *args]
    return subprocess.run(argv, capture_output=True, timeout=120, check=False, **kwargs)


@dataclass(frozen=True)
class GeneratedKey:
    label: str
    fingerprint: str  # of the primary key
    secret_file: Path
    public_file: Path


# Every key of KEY_TYPES and EXTRA_KEYS, generated once by `KeyMaker` and committed
# (``python -m tests.make_keys`` writes them again): a run generated them for ~6 s of CPU, the
# DSA 3072 one alone up to 7 s while the tests that wanted it waited.
COMMITTED_KEYS = DATA / "keys"


def committed_key(label: str) -> GeneratedKey | None:
    files = [COMMITTED_KEYS / f"{label}{suffix}" for suffix in (".fpr", ".sec.asc", ".pub.asc")]
    if not all(f.is_file() for f in files):
        return None
    return GeneratedKey(label, files[0].read_text().strip(), files[1], files[2])


class KeyMaker:
    """Generates test keys on first use, in a home served by its own agent. With ``shared``
    (a directory all test processes of one run see), each key is generated once per run, not
    once per test process: the first process to need it generates it under a lock and leaves
    its files there; the others read them."""

    def __init__(self, home: Path, agent: GpgAgent, shared: Path | None = None) -> None:
        self.home = home
        self.agent = agent
        self.shared = shared
        self._keys: dict[str, GeneratedKey] = {}

    def get(self, label: str) -> GeneratedKey:
        if label not in self._keys:
            self._keys[label] = (committed_key(label)
                                 or (self._shared(label) if self.shared else self._generate(label)))
        return self._keys[label]

    def _shared(self, label: str) -> GeneratedKey:
        import fcntl

        assert self.shared is not None
        self.shared.mkdir(mode=0o700, exist_ok=True)
        done = self.shared / f"{label}.fpr"
        with open(self.shared / f"{label}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not done.exists():
                key = self._generate(label)
                shutil.copy(key.secret_file, self.shared / key.secret_file.name)
                shutil.copy(key.public_file, self.shared / key.public_file.name)
                done.write_text(key.fingerprint)
        return GeneratedKey(label, done.read_text(), self.shared / f"{label}.sec.asc",
                            self.shared / f"{label}.pub.asc")

    def _generate(self, label: str) -> GeneratedKey:
        spec = EXTRA_KEYS[label] if label in EXTRA_KEYS else KEY_TYPES[label].params
        if "Key-Usage" not in spec:
            spec += "Key-Usage: sign\n"
        protected = "Passphrase:" in spec
        if not protected:
            spec += "%no-protection\n"
        params = (
            f"{spec}Name-Real: Test {label}\nName-Email: t@example\nExpire-Date: 0\n"
            f"Creation-Date: {KEY_CREATED}\n%commit\n"
        )
        made = run_gpg(
            self.home,
            "--pinentry-mode", "loopback", "--status-fd", "1", "--gen-key",
            input=params.encode(),
        )  # fmt: skip
        created = [line.split()[-1] for line in made.stdout.decode().splitlines()
                   if line.startswith("[GNUPG:] KEY_CREATED")]  # fmt: skip
        assert made.returncode == 0 and len(created) == 1, made.stderr.decode()
        fingerprint = created[0]
        secret_file = self.home / f"{label}.sec.asc"
        public_file = self.home / f"{label}.pub.asc"
        export = ["--pinentry-mode", "loopback", "--armor", "--export-secret-keys", fingerprint]
        if protected:
            read_fd, write_fd = os.pipe()
            os.write(write_fd, PASSPHRASE.encode() + b"\n")
            os.close(write_fd)
            try:
                secret = run_gpg(self.home, "--passphrase-fd", str(read_fd), *export,
                                 pass_fds=(read_fd,))  # fmt: skip
            finally:
                os.close(read_fd)
        else:
            secret = run_gpg(self.home, *export)
        public = run_gpg(self.home, "--armor", "--export", fingerprint)
        assert secret.returncode == 0 and secret.stdout, secret.stderr.decode()
        assert public.returncode == 0 and public.stdout, public.stderr.decode()
        secret_file.write_bytes(secret.stdout)
        public_file.write_bytes(public.stdout)
        return GeneratedKey(label, fingerprint, secret_file, public_file)


# -- an in-process transport for signing jobs -------------------------------------------------
# `InProcessDispatcher` offers the `server.dispatch.Dispatcher` protocol without a socket or a
# worker process: it builds and signs each job with the real `OpenPgpSigner` over a real
# `GpgAgent`. It is not a mock: the signed object is exactly what a worker would answer, only
# the transport is left out.
WORKER = "inproc"


@dataclass(frozen=True)
class InProcessWorker:
    """What `Dispatcher.workers` shows of the one in-process "worker"."""

    name: str
    key: str
    pid: int


class InProcessDispatcher:
    """`Dispatcher` over a real signer in this process; the blocking signature runs in a
    thread, as it would in a worker. ``jobs`` records every job signed, in order, and
    ``internal`` whether each was the service's own (`Dispatcher.sign`)."""

    requeued: int = 0

    def __init__(self, signer: OpenPgpSigner, key: str = PRIMARY) -> None:
        self.signer = signer
        self.key = key
        self.jobs: list[Job] = []
        self.internal: list[bool] = []

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def sign(self, job: Job, key: str = PRIMARY, *, internal: bool = False) -> Signed:
        if key != self.key:
            raise Unavailable(f"no worker holds key {key}")
        text = await asyncio.to_thread(self.signer.build, job)
        self.jobs.append(job)
        self.internal.append(internal)
        return Signed(text, WORKER, 1)

    @property
    def workers(self) -> Mapping[str, InProcessWorker]:
        return {WORKER: InProcessWorker(WORKER, self.key, os.getpid())}

    @property
    def queue_depth(self) -> int:
        return 0

    def keys_served(self) -> set[str]:
        return {self.key}


# -- a throwaway PostgreSQL cluster for the test session --------------------------------------
def postgres_bindir() -> Path | None:
    """The directory of the installed PostgreSQL server binaries (Debian keeps them out of
    PATH, under /usr/lib/postgresql/<version>/bin), newest version first."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class ThrowawayPostgres:
    """A PostgreSQL cluster of its own in a temporary directory, on a free loopback port,
    trust authentication, no fsync (test data only). The postmaster is our direct child (run as
    the ``postgres`` user when we are root, since PostgreSQL refuses to run as root) and is
    stopped by its PID."""

    def __init__(self, bindir: Path, max_connections: int = 200) -> None:
        self.bindir = bindir
        self.max_connections = max_connections
        self.dir = Path(tempfile.mkdtemp(prefix="stampd-pg-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            shutil.chown(self.dir, self.user, self.user)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(argv, capture_output=True, timeout=120, check=False,
                              stdin=subprocess.DEVNULL, user=self.user, cwd=self.dir)

    def start(self) -> None:
        data = self.dir / "data"
        r = self._run(str(self.bindir / "initdb"), "-D", str(data), "-A", "trust",
                      "-U", "postgres", "--no-sync", "-E", "UTF8")
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stderr.decode()[-500:]}")
        log = open(self.dir / "postgres.log", "wb")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(data), "-p", str(self.port),
             "-k", str(self.dir), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "full_page_writes=off", "-c", f"max_connections={self.max_connections}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, user=self.user)
        log.close()
        import psycopg

        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(self.admin_url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.dir / "postgres.log").read_text(errors="replace")[-1000:]
                    self.stop()
                    raise RuntimeError(f"PostgreSQL did not start:\n{tail}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# A witness (c2sp tlog-witness add-checkpoint) written here, for the log's side of the protocol


class LocalWitness:
    """A witness on loopback in a thread, made of the pure protocol code
    (`formats.tlog.witness.check_add_checkpoint`) and an Ed25519 key of `cryptography`; its
    ``mode`` switches how it answers: ``good`` (checks, records, cosigns), ``down`` (its port
    closed, open connections dropped), ``slow`` (sleeps ``slow_seconds`` first), ``garbage``
    (200 with junk), ``refusing`` (403). ``trust(vkey)`` names the log it accepts; until then
    every request is 404 (unknown log). ``requests`` lists (old size, new size) of each
    request it checked; ``authorizations`` the Authorization header of each request (None
    without one)."""

    def __init__(self, name: str, port: int | None = None, slow_seconds: float = 3.0) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        from formats.note import ED25519_COSIGNATURE, VerifierKey

        self.name = name
        self.key = Ed25519PrivateKey.generate()
        self.public = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.vkey = VerifierKey(name, ED25519_COSIGNATURE, self.public).encode()
        self.port = port or free_port()
        self.slow_seconds = slow_seconds
        self.mode = "good"
        self.trusted: dict[str, list[Any]] = {}
        self.records: dict[str, Any] = {}  # origin -> WitnessRecord
        self.requests: list[tuple[int, int]] = []
        self.authorizations: list[str | None] = []
        self.lock = threading.Lock()
        self.clock: Callable[[], float] = time.time
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.listen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spec(self) -> str:
        """Its ``URL=VKEY`` for ``stampd serve --witness``."""
        return f"{self.url}={self.vkey}"

    def trust(self, log_vkey: str) -> None:
        from formats.note import Ed25519Verifier

        v = Ed25519Verifier.from_vkey(log_vkey)
        self.trusted = {v.name: [v]}

    def set_mode(self, mode: str) -> None:
        assert mode in ("good", "down", "slow", "garbage", "refusing"), mode
        was, self.mode = self.mode, mode
        if mode == "down" and was != "down":
            self.close()
        elif was == "down" and mode != "down":
            self.listen()

    def listen(self) -> None:
        witness = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                witness.authorizations.append(self.headers.get("Authorization"))
                mode = witness.mode
                if mode == "down":  # (a connection kept alive from before: dropped)
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if mode == "slow":
                    time.sleep(witness.slow_seconds)
                if self.path != "/add-checkpoint":
                    return self.answer(404, b"not found\n")
                if mode == "garbage":
                    return self.answer(200, b"\x00\xffthis is no cosignature\n")
                if mode == "refusing":
                    return self.answer(403, b"not today\n")
                status, ctype, out = witness.add_checkpoint(body)
                self.answer(status, out, ctype)

            def answer(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
                with contextlib.suppress(OSError):  # (a client that gave up: slow mode)
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True,
                                        name=f"witness {self.name}")
        self._thread.start()

    def add_checkpoint(self, body: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) of an add-checkpoint request, as the spec says."""
        from formats.note import parse_note
        from formats.tlog.checkpoint import Checkpoint, cosign
        from formats.tlog.witness import (
            SIZE_CONTENT_TYPE,
            AddCheckpoint,
            BadLogSignature,
            InconsistentCheckpoint,
            MalformedWitnessRequest,
            SizeConflict,
            UnknownLog,
            WitnessError,
            WitnessRecord,
            check_add_checkpoint,
            encode_size,
        )

        codes = {MalformedWitnessRequest: 400, BadLogSignature: 403, UnknownLog: 404,
                 SizeConflict: 409, InconsistentCheckpoint: 422}
        with self.lock:  # (check and store at once)
            try:
                request = AddCheckpoint.parse(body)
                origin = Checkpoint.parse(parse_note(request.checkpoint).text).origin
                cp = check_add_checkpoint(request, self.trusted, self.records.get(origin))
            except SizeConflict as e:
                return 409, SIZE_CONTENT_TYPE, encode_size(e.known)
            except WitnessError as e:
                return codes.get(type(e), 400), "text/plain", f"{e}\n".encode()
            except ValueError as e:
                return 400, "text/plain", f"{e}\n".encode()
            self.requests.append((request.old_size, cp.size))
            self.records[cp.origin] = WitnessRecord(cp.size, cp.root)
        sig = cosign(cp.body(), self.name, self.public, int(self.clock()), self.key.sign)
        return 200, "text/plain; charset=utf-8", sig.line().encode()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


class WitnessedLog:
    """A log for tests of the witness (c2sp.org/tlog-witness): an Ed25519 key of its own
    (``cryptography``), leaves ``leaf-<i>``, checkpoints of any size signed by its key and
    ``add-checkpoint`` requests between two sizes with their consistency proofs."""

    def __init__(self, origin: str, leaves: int = 64, seed: bytes | None = None) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        from formats.tlog.merkle import leaf_hash, tree_levels

        self.origin = origin
        self.key = (Ed25519PrivateKey.from_private_bytes(seed) if seed is not None
                    else Ed25519PrivateKey.generate())
        self.public = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.hashes = [leaf_hash(b"leaf-%d" % i) for i in range(leaves)]
        self.levels = tree_levels(self.hashes)

    @property
    def vkey(self) -> str:
        from formats.note import ED25519, VerifierKey

        return VerifierKey(self.origin, ED25519, self.public).encode()

    def node(self, level: int, index: int) -> bytes:
        return self.levels[level][index]

    def root(self, size: int) -> bytes:
        from formats.tlog.merkle import tree_root

        return tree_root(size, self.node)

    def checkpoint(self, size: int, root: bytes | None = None) -> bytes:
        """The checkpoint note of ``size`` (of ``root``, to forge another tree), signed."""
        from formats.note import ed25519_signer, sign_note
        from formats.tlog.checkpoint import Checkpoint

        text = Checkpoint(self.origin, size, self.root(size) if root is None else root,
                          ()).body()
        signer = ed25519_signer(self.origin, self.public, self.key.sign)
        return sign_note(text, [signer]).encode()

    def proof(self, old: int, new: int) -> tuple[bytes, ...]:
        from formats.tlog.merkle import consistency_proof

        return tuple(consistency_proof(old, new, self.node)) if old else ()

    def request(self, old: int, new: int, checkpoint: bytes | None = None,
                proof: tuple[bytes, ...] | None = None) -> bytes:
        """The body of an ``add-checkpoint`` request from ``old`` to ``new``."""
        from formats.tlog.witness import AddCheckpoint

        return AddCheckpoint(old, self.proof(old, new) if proof is None else proof,
                             self.checkpoint(new) if checkpoint is None else checkpoint
                             ).encode()
