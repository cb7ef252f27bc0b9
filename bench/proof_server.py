"""What the proof programs share on the server side: a real ``stampd serve`` (tests.helpers
`start_server`: the fixed test key, loopback, a runtime directory of its own, stopped by PID) on
SQLite or on a database of a throwaway PostgreSQL cluster; its process tree (API process,
supervisor, workers, agents: found by parent PID, never by name); killing the API process and
starting it again on the same port and data; and what can be checked from outside afterwards:
the journal (table ``stamps``), the public log (``hashes.log``, ``digests.log`` of every commit
on main) and `stampd audit` of the log cloned over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.procs import process_table
from bench.proof_http import children, cmdline
from tests.helpers import (
    TEST_FPR,
    Server,
    ThrowawayPostgres,
    free_port,
    postgres_bindir,
    seed_data_dir,
    short_tmpdir,
    start_server,
)
from workers.pool import POOL_NAME
from workers.worker import WORKER_NAME

BIN = Path(sys.executable).parent
TLOG_KEY_ID = "tlog-ed25519"  # the log key's id


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_proof(name: str, body: Callable[[Path], Awaitable[int]], *, prefix: str,
              keep: bool) -> int:
    """Run a proof program's ``body`` in a fresh work directory: its exit status, 2 when it
    could not run. The directory is removed unless ``keep`` or the proof failed."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    code = 2
    try:
        code = asyncio.run(body(workdir))
        return code
    except (ProofError, RuntimeError) as e:  # RuntimeError: the server did not start
        print(f"{name}: could not run: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if keep or code != 0:
            progress(f"data directory and server log kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def verdict(problems: list[str], alive: bool, passed: str) -> int:
    """Print a proof's verdict: FAIL and each problem (exit status 1), or PASS and what
    held (0). A server that died is a problem too."""
    if not alive:
        problems = [*problems, "the server died"]
    if problems:
        print(f"FAIL: {len(problems)} problem(s)")
        for p in problems:
            print(f"  {p}")
        return 1
    print(f"PASS: {passed}")
    return 0


def wait_for_none(db_url: str, counts: tuple[str, ...], timeout: float) -> bool:
    """Wait (looking every 0.5 s, at most ``timeout`` seconds) until every ``select count(*)``
    of ``counts`` is 0 in the database ``db_url``; whether they all came to 0."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            with engine.connect() as conn:
                if all(conn.execute(text(q)).scalar_one() == 0 for q in counts):
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
    finally:
        engine.dispose()

class ProofError(Exception):
    """The proof could not run (exit status 2), as opposed to a broken promise (1)."""


class Postgres:
    """A throwaway PostgreSQL cluster, one database per server; stopped by PID."""

    def __init__(self) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise ProofError("PostgreSQL server binaries are required for --db postgres "
                             "(apt-get install postgresql)")
        self.cluster = ThrowawayPostgres(bindir)

    def start(self) -> None:
        self.cluster.start()

    def database(self) -> str:
        import psycopg

        name = f"stampd_proof_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.cluster.admin_url, autocommit=True, connect_timeout=10) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.cluster.port}/{name}"

    def stop(self) -> None:
        self.cluster.stop()


@contextmanager
def database(db: str) -> Iterator[str | None]:
    """None for SQLite (the server's default file), or the URL of a fresh PostgreSQL database
    whose cluster is stopped when the block ends."""
    if db == "sqlite":
        yield None
        return
    pg = Postgres()
    try:
        pg.start()
        yield pg.database()
    finally:
        pg.stop()


@dataclass
class Ledger:
    """The journal and the public log, read once the log has settled."""

    states: dict[str, str]  # identity (commit id or digest) -> journal state
    logged: set[str]  # commit ids in hashes.log and digests in digests.log of main
    log_commits: int
    settled: bool


class ProofServer:
    """One ``stampd serve`` on one database, which may be killed and started again on the
    same port, data directory and database."""

    def __init__(self, db: str, workdir: Path, database_url: str | None, *, workers: int = 2,
                 commit_interval: float = 2.0, env: dict[str, str] | None = None,
                 api_processes: int = 1, tlog: bool = False) -> None:
        self.db = db
        self.workdir = workdir
        self.data = seed_data_dir(workdir / "data")
        self.database_url = database_url
        self.db_url = database_url or f"sqlite:///{self.data / 'stampd.sqlite3'}"
        self.workers = workers
        self.api_processes = api_processes
        self.commit_interval = commit_interval
        self.env = dict(env or {})
        # The transparency log: its key has a worker (and an agent) of its own.
        self.tlog = tlog
        self.env["STAMPD_TLOG"] = "on" if tlog else "off"
        self.port = free_port()
        self.runtime = short_tmpdir("pr")
        self.server: Server | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> None:
        self.starts += 1
        self.server = start_server(self.data, workers=self.workers,
                                   commit_interval=self.commit_interval,
                                   database_url=self.database_url, extra_env=self.env,
                                   port=self.port, runtime_dir=self.runtime,
                                   api_processes=self.api_processes)
        if self.tlog:
            try:
                self.server.wait_ready(self.all_workers)
            except BaseException:
                self.server.stop()
                raise

    @property
    def all_workers(self) -> int:
        """Every signing worker: the stamping key's and the log key's."""
        return self.workers + (1 if self.tlog else 0)

    @property
    def api_pid(self) -> int:
        assert self.server is not None
        return self.server.proc.pid

    # -- the process tree: API -> supervisor -> workers -> agents ----------------------------
    def http_pids(self) -> list[int]:
        """The HTTP processes, with several (``--api-processes``): the children named
        stampd-http-N of the HTTP manager (the API process's child named stampd-api), which
        restarts one that dies."""
        table = process_table()
        managers = {p for p, info in table.items()
                    if info.ppid == self.api_pid and info.comm == "stampd-api"}
        return [p for p, info in table.items()
                if info.ppid in managers and info.comm.startswith("stampd-http-")]

    def supervisor_pids(self) -> list[int]:
        return [p for p, info in process_table().items()
                if info.ppid == self.api_pid and info.comm == POOL_NAME]

    def worker_pids(self) -> list[int]:
        """The supervisor's children named stampd-worker (forked: its command line)."""
        supervisors = set(self.supervisor_pids())
        return sorted(p for p, info in process_table().items()
                      if info.ppid in supervisors and info.comm == WORKER_NAME)

    def agent_pids(self) -> list[int]:
        return self.agents_of(self.worker_pids())

    @staticmethod
    def agents_of(workers: list[int]) -> list[int]:
        return [a for w in workers for a in children(w)
                if os.path.basename(cmdline(a).split(b"\0")[0]) in (b"gpg-agent", b"ssh-agent")]

    def key_worker_pids(self, key_id: str | None) -> list[int]:
        """The workers of the key ``key_id`` (the supervisor's log line that started each
        names its key); None: of every key but the log key's (``tlog-ed25519``)."""
        assert self.server is not None
        workers = self.worker_pids()
        key_of = self.server.worker_keys(workers)
        return [w for w in workers
                if key_of.get(w) == key_id or (key_id is None and key_of.get(w) != TLOG_KEY_ID)]

    def log_lock_holder(self) -> int | None:
        """The process holding ``run/log.lock`` (the one that makes the git log's commits and
        sequences the transparency log), from /proc/locks; None if none holds it."""
        try:
            inode = os.stat(self.data / "run" / "log.lock").st_ino
            locks = Path("/proc/locks").read_text()
        except OSError:
            return None
        for line in locks.splitlines():
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (or POSIX); "->" lines wait
            if len(fields) >= 6 and fields[1] != "->" and fields[5].rsplit(":", 1)[-1] == str(
                    inode):
                return int(fields[4])
        return None

    def ready_workers(self) -> int:
        try:
            with urllib.request.urlopen(self.url + "readyz", timeout=5) as r:
                return len(json.loads(r.read()).get("workers", []))
        except (OSError, ValueError):
            return 0

    def readyz(self) -> dict[str, object]:
        try:
            with urllib.request.urlopen(self.url + "readyz", timeout=5) as r:
                body: dict[str, object] = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        return body

    def wait_workers(self, timeout: float = 60) -> float:
        """Seconds until /readyz lists every worker again."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.ready_workers() >= self.all_workers:
                return time.monotonic() - t0
            time.sleep(0.1)
        raise ProofError(f"the pool did not recover within {timeout} s")

    def kill_api(self) -> list[int]:
        """SIGKILL the API process; its supervisor, workers and agents die with it
        (PR_SET_PDEATHSIG). Whatever is left after a grace is killed by PID and returned."""
        assert self.server is not None
        os.kill(self.api_pid, signal.SIGKILL)
        self.server.proc.wait(timeout=10)
        return self.server.reap_leftovers(grace=10)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.runtime, ignore_errors=True)

    def log_tail(self) -> str:
        return self.server.log() if self.server is not None else ""

    # -- afterwards -------------------------------------------------------------------------
    def wait_settled(self, timeout: float) -> bool:
        """Wait until every stamp the log may show has reached a committed log commit: no
        signed or pending stamp unassigned, no log commit pending."""
        return wait_for_none(self.db_url, (
            "select count(*) from stamps where log_commit_id is null and "
            "state in ('signed', 'pending', 'orphaned')",
            "select count(*) from log_commits where state = 'pending'"), timeout)

    def ledger(self, settle_timeout: float) -> Ledger:
        from sqlalchemy import create_engine, text

        settled = self.wait_settled(settle_timeout)
        engine = create_engine(self.db_url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(text('select "commit", digest, state from stamps')).all()
        finally:
            engine.dispose()
        states: dict[str, str] = {}
        for commit, digest, state in rows:
            for ident in (commit, digest):
                if ident:
                    states[ident] = state
        n, logged = read_log(self.data / "log.git")
        return Ledger(states, logged, n, settled)

    def audit(self) -> tuple[bool, str]:
        """``stampd audit <url>log.git --json``, as anyone would run it."""
        try:
            r = subprocess.run([str(BIN / "stampd"), "audit", self.url + "log.git", "--json"],
                               capture_output=True, text=True, timeout=300, check=False)
        except subprocess.TimeoutExpired:
            return False, "stampd audit timed out"
        try:
            report = json.loads(r.stdout)
        except ValueError:
            return False, f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}"
        fpr = report.get("server_fingerprint")
        failures = report.get("failures", [])
        if r.returncode != 0 or not report.get("ok") or fpr != TEST_FPR:
            return False, (f"exit {r.returncode}, key {fpr}, {len(failures)} failures: "
                           f"{failures[:3]}")
        return True, f"OK, {len(report.get('log', []))} log commits, key {fpr[:16]}..."


def read_log(git_dir: Path) -> tuple[int, set[str]]:
    """(commits on main, every commit id of their hashes.log and digest of digests.log)."""
    import pygit2

    if not git_dir.exists():
        return 0, set()
    repo = pygit2.Repository(str(git_dir))
    try:
        head = repo.references["refs/heads/main"].target
    except KeyError:
        return 0, set()
    words: set[str] = set()
    n = 0
    for commit in repo.walk(head, pygit2.enums.SortMode.TOPOLOGICAL):
        n += 1
        for name in ("hashes.log", "digests.log"):
            try:
                blob = commit.tree[name]
            except KeyError:
                continue
            for line in blob.data.decode("ascii", "replace").splitlines():  # type: ignore[attr-defined]
                if line:
                    words.add(line.split()[-1])  # "<id>" or "<algorithm> <digest>"
    return n, words
