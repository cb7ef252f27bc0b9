"""Shared fixtures: real servers as subprocesses, a fixed test key, the local PostgreSQL,
GnuPG and generated test keys. Helpers (no fixtures) are in tests/helpers.py.

Tests are in three folders: unit/ (pure code), integration/ (real agents, git, databases,
in-process components) and system/ (whole servers as subprocesses, marked ``slow``). Every test
that uses the local PostgreSQL (the ``pg_url`` fixture) is marked ``postgres``.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import helpers
from tests.helpers import (
    ROOT,
    TEST_UID,
    KeyMaker,
    Server,
    ThrowawayPostgres,
    cmdlines,
    free_port,
    kill_pids,
    pid_gone,
    pids_mentioning,
    postgres_bindir,
    proc_cmdline,
    seed_data_dir,
    short_tmpdir,
    start_server,
    terminate,
)
from tests.mailservers import MailServerError, MailServers

# RFC 3161 (on by default) adds a key, a worker and an agent to every server and worker host:
# the processes tests start run without it unless a test turns it on (tests/system/test_tsa*).
os.environ.setdefault("STAMPD_TSA", "false")
# The transparency log (on by default) likewise adds its key, a worker and an agent: off
# unless a test turns it on (STAMPD_TLOG=on).
os.environ.setdefault("STAMPD_TLOG", "off")

# Scheduling (``-n``, ``--dist worksteal``): tests are handed to the test processes one unit at a
# time, the costliest units first, so that short tests fill the gaps at the end instead of a long
# one starting last. A unit is one test, or every test of a module that uses a module- or
# class-scoped fixture (a server shared by the module's tests): those run in one process, one
# after another, so that the shared server starts once, not once for each process the module's
# tests were spread over (worksteal splits modules, and a process that goes back to a module
# starts its server again). A unit's cost is the sum of its tests' seconds in the last run (the
# pytest cache, else tests/durations.json), or a guess by kind where neither has them.
GUESSED_SECONDS = {"system": 8.0, "integration": 1.0, "unit": 0.05}
DURATIONS_KEY = "stampd/durations"
SHARED_SCOPES = ("module", "class", "package")
UNITS_DIR = pytest.StashKey[Path]()
FORK_SERVER = pytest.StashKey["subprocess.Popen[bytes]"]()
FORKING = os.environ.get("STAMPD_TEST_FORK", "1") != "0"
DURATIONS: dict[str, float] = {}  # this run's seconds per test (the controller's reports)


def shared_unit(item: pytest.Item) -> str | None:
    """The module of a test that uses a fixture shared by several tests of its module (a
    module-scoped server), else None."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        if defs and defs[-1].scope in SHARED_SCOPES:
            return item.nodeid.split("::")[0]
    return None


# The seconds of the slower tests in a quiet run, committed: a fresh clone (CI) has no pytest
# cache, and without them its order is guessed by kind, so a long test may start last. The
# cache's figures of later runs take precedence. (`python tests/durations.py` writes it again.)
COMMITTED_DURATIONS = Path(__file__).with_name("durations.json")


def committed_durations() -> dict[str, float]:
    try:
        data = json.loads(COMMITTED_DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def guessed_seconds(item: pytest.Item) -> float:
    parts = Path(item.path).parts
    return next((v for k, v in GUESSED_SECONDS.items() if k in parts), 1.0)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the local PostgreSQL ``postgres``; order the tests by unit,
    costliest unit first (order within a shared unit is kept), and tell the scheduler the units
    (a file the controller named, see ``pytest_configure_node``)."""
    for item in items:
        if "pg_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)

    cache = getattr(config, "cache", None)
    last: dict[str, float] = {**committed_durations(),
                              **((cache.get(DURATIONS_KEY, {}) if cache is not None else {})
                                 or {})}
    unit_of = {item.nodeid: shared_unit(item) or item.nodeid for item in items}
    cost: dict[str, float] = {}
    for item in items:
        unit = unit_of[item.nodeid]
        # (a guess: a shared unit's server starts with its first test; the others are quick)
        guess = guessed_seconds(item)
        if unit in cost and unit != item.nodeid:
            guess = min(guess, 1.0)
        cost[unit] = cost.get(unit, 0.0) + last.get(item.nodeid, guess)
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(unit_of[item.nodeid], i)
    position = {item.nodeid: i for i, item in enumerate(items)}
    items.sort(key=lambda it: (-cost[unit_of[it.nodeid]], first[unit_of[it.nodeid]],
                               position[it.nodeid]))

    units_file = getattr(config, "workerinput", {}).get("stampd_units_file")
    if units_file:
        shared = {nodeid: unit for nodeid, unit in unit_of.items() if unit != nodeid}
        tmp = f"{units_file}.{os.getpid()}"
        Path(tmp).write_text(json.dumps(shared))
        os.replace(tmp, units_file)  # (every test process writes the same)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (the test modules and what they import, ~1,400 items) lives as
    long as the test process: moved out of the garbage collector's sight, so that its full
    collections, and the five at the end of the session, do not walk it again each time
    (about a third of a test process's collection time)."""
    gc.freeze()


def pytest_configure(config: pytest.Config) -> None:
    shared = getattr(config, "workerinput", {}).get("stampd_shared_dir")
    if shared:  # (a test process of pytest -n: the run's directory, see migrated_journal)
        helpers.SHARED_DIR = Path(shared)
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "worksteal":
        config.stash[UNITS_DIR] = units_dir = Path(tempfile.mkdtemp(prefix="stampd-units-"))
        if FORKING:
            config.stash[FORK_SERVER] = _start_fork_server(units_dir / "fork.sock")


def _start_fork_server(path: Path) -> subprocess.Popen[bytes]:
    """The run's one fork server (tests/forkserver.py), listening at ``path`` for every test
    process (`fork_server`): the socket listens before the process starts, so that none has
    to wait for it to exist."""
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(path))
        listener.listen(64)
        return subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", "--listen", str(listener.fileno())],
            pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        listener.close()


def pytest_unconfigure(config: pytest.Config) -> None:
    server = config.stash.get(FORK_SERVER, None)
    if server is not None:
        terminate(server, 10)
    units_dir = config.stash.get(UNITS_DIR, None)
    if units_dir is not None:
        _stop_shared_postgres(units_dir)
        shutil.rmtree(units_dir, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    units_dir = node.config.stash.get(UNITS_DIR, None)
    if units_dir is not None:
        node.workerinput["stampd_units_file"] = str(units_dir / "units.json")
    if node.config.stash.get(FORK_SERVER, None) is not None:
        node.workerinput["stampd_fork_socket"] = str(units_dir / "fork.sock")
    if units_dir is not None:
        node.workerinput["stampd_shared_dir"] = str(units_dir)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """For ``--dist worksteal``: xdist's scope scheduler (a unit at a time to a process that is
    nearly out of work, in collection order), with the units above."""
    units_dir = config.stash.get(UNITS_DIR, None)
    if units_dir is None:
        return None
    from xdist.scheduler import LoadScopeScheduling

    units_file = units_dir / "units.json"

    class UnitScheduling(LoadScopeScheduling):
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # (read once every test process has collected)
                try:
                    self.units = json.loads(units_file.read_text())
                except (OSError, ValueError):
                    self.units = {}
            return self.units.get(nodeid, nodeid)

    config.option.loadscopereorder = False  # collection order: costliest first
    return UnitScheduling(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    DURATIONS[report.nodeid] = DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Keep each test's seconds (setup, call and teardown) for the next run's order."""
    config = session.config
    cache = getattr(config, "cache", None)
    if hasattr(config, "workerinput") or cache is None or not DURATIONS:
        return
    merged = {**(cache.get(DURATIONS_KEY, {}) or {}),
              **{k: round(v, 2) for k, v in DURATIONS.items()}}
    cache.set(DURATIONS_KEY, merged)


@pytest.fixture(scope="session", autouse=True)
def fork_server(pytestconfig: pytest.Config) -> Iterator[None]:
    """`start_server` forks its servers from one process that has imported stampd (about 0.9 s
    of CPU less for each of the suite's ~150 server starts; tests/forkserver.py), unless
    STAMPD_TEST_FORK=0: under ``pytest -n`` the run's one (`pytest_configure`), else this
    process's own, stopped by PID after the session."""
    if not FORKING:
        yield
        return
    shared = getattr(pytestconfig, "workerinput", {}).get("stampd_fork_socket")
    helpers.FORK_SERVER = server = helpers.ForkServer(Path(shared) if shared else None)
    try:
        yield
    finally:
        helpers.FORK_SERVER = None
        server.close()


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
    # Two HTTP processes (issue 15): the interop, hook and hardening tests use this server.
    server = start_server(data, workers=2, api_processes=2)
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


# Under ``pytest -n`` the test processes share one throwaway PostgreSQL (each has its own
# template and databases on it): the first that needs it starts it and writes its URL, PID and
# directory here, in the run's directory; the controlling process stops it by that PID after
# the run. (One cluster per test process was initdb and a start, ~1.3 s and ~1.5 s of CPU,
# in each of the six.) Room for the connections of six processes' tests at once.
SHARED_PG = "postgres.json"
SHARED_PG_CONNECTIONS = 600


def _postgres_bindir() -> Path:
    bindir = postgres_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries are required (apt-get install postgresql), "
                    "or set STAMPD_TEST_PG_URL to a running server")
    return bindir


def _shared_postgres(shared: Path) -> str:
    """The admin URL of the run's one throwaway PostgreSQL, started here (under a lock) if no
    test process has started it yet."""
    info = shared / SHARED_PG
    with open(shared / "postgres.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        if not info.exists():
            cluster = ThrowawayPostgres(_postgres_bindir(), SHARED_PG_CONNECTIONS)
            try:
                cluster.start()
            except BaseException:
                cluster.stop()
                raise
            assert cluster.proc is not None
            tmp = shared / f"{SHARED_PG}.{os.getpid()}"
            tmp.write_text(json.dumps({"url": cluster.admin_url, "pid": cluster.proc.pid,
                                       "dir": str(cluster.dir)}))
            os.replace(tmp, info)
        return str(json.loads(info.read_text())["url"])


def _stop_shared_postgres(shared: Path) -> None:
    """Stop the run's shared PostgreSQL, if a test process started one, by its PID (fast
    shutdown, SIGKILL after 30 s); then remove its directory."""
    info = shared / SHARED_PG
    if not info.exists():
        return
    found = json.loads(info.read_text())
    pid, home = int(found["pid"]), str(found["dir"])

    def exited() -> bool:  # (a zombie has exited: its parent, a test process, may still run)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rpartition(b") ")[2][:1] == b"Z"
        except OSError:
            return pid_gone(pid)

    if home.encode() in proc_cmdline(pid):  # (the postmaster, not a PID used again)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while not exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not exited():
            kill_pids([pid])
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_url(pytestconfig: pytest.Config) -> Iterator[str]:
    """A PostgreSQL server for the session: a throwaway cluster started from the installed
    server binaries (stopped at the end; under ``pytest -n`` one for the run's test
    processes, `_shared_postgres`), or the server that ``STAMPD_TEST_PG_URL`` names
    (e.g. ``postgresql://postgres@127.0.0.1:5432/postgres``). Fails, never skips, when
    neither can be had."""
    given = os.environ.get("STAMPD_TEST_PG_URL")
    if given:
        yield given
        return
    shared = getattr(pytestconfig, "workerinput", {}).get("stampd_shared_dir")
    if shared:
        yield _shared_postgres(Path(shared))
        return
    cluster = ThrowawayPostgres(_postgres_bindir())
    try:
        cluster.start()
        yield cluster.admin_url
    finally:
        cluster.stop()
    assert cluster.proc is None or cluster.proc.poll() is not None


def _pg_database(admin_url: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (a copy of ``template`` if given) on the session's server; its
    SQLAlchemy URL."""
    import psycopg

    sql = f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")
    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)
    except psycopg.OperationalError as e:
        pytest.fail(f"PostgreSQL at {admin_url} is required for this test: {e}")
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{name}"


def _drop_pg_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str) -> Iterator[str]:
    """A database migrated to the newest revision once per test process, the template of each
    test's database."""
    from server import db

    name = f"stampd_template_{uuid.uuid4().hex[:12]}"
    engine = db.make_engine(_pg_database(pg_admin_url, name))
    try:
        db.upgrade(engine)
    finally:
        engine.dispose()  # (a template must have no connections when it is copied)
    yield name
    _drop_pg_database(pg_admin_url, name)


@pytest.fixture
def pg_url(pg_admin_url: str, pg_template: str) -> Iterator[str]:
    """A database of the session's PostgreSQL server for this test alone, migrated to the
    newest revision, dropped after it: no test sees another's rows or schema changes."""
    name = f"stampd_test_{uuid.uuid4().hex[:12]}"
    url = _pg_database(pg_admin_url, name, template=pg_template)
    yield url
    _drop_pg_database(pg_admin_url, name)


@contextlib.contextmanager
def running_mail_servers(users: list[str], routes: dict[str, tuple[str, int]] | None = None
                         ) -> Iterator[MailServers]:
    """`MailServers` with ``users`` (and ``routes``: domain -> host, port), started, and
    stopped by PID at the end. Fails, never skips, when Postfix or Dovecot is missing."""
    try:
        servers = MailServers(users)
        for domain, (host, port) in (routes or {}).items():
            servers.route(domain, host, port)
        servers.start()
    except MailServerError as e:
        pytest.fail(str(e))
    pids = servers.pids()
    try:
        yield servers
    finally:
        servers.stop()
    assert all(pid_gone(pid) for pid in pids)


@pytest.fixture
def mail_servers() -> Iterator[MailServers]:
    """A throwaway Postfix (submission: STARTTLS, SASL login) and Dovecot (IMAP: STARTTLS,
    IDLE; LMTP delivery) on free loopback ports, with the users ``stampd`` and ``stamper`` of
    ``MAIL_DOMAIN``, and a CA of their own (tests/mailservers.py); stopped by PID after the
    test. Fails, never skips, when Postfix or Dovecot is missing (tests/sysdeps.sh)."""
    with running_mail_servers(["stampd", "stamper"]) as servers:
        yield servers


@pytest.fixture
def routed_mail_servers() -> Iterator[tuple[MailServers, int]]:
    """The mail servers with the user ``stampd`` only, Postfix relaying the domain ``b.test``
    by SMTP to a free loopback port (another stampd's mail listener, to be started there);
    (the servers, that port)."""
    port = free_port()
    with running_mail_servers(["stampd"], {"b.test": ("127.0.0.1", port)}) as servers:
        yield servers, port


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                   ) -> None:
    """Tests never touch the user's ~/.gnupg or ~/.gitconfig (the git-timestamp client writes
    its trust-on-first-use key id into the global git config)."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("GNUPGHOME", raising=False)


@pytest.fixture(autouse=True, scope="module")
def _stop_stray_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """gpg starts agents on its own (e.g. on import into a verifying keyring); after each
    module's tests, stop by PID every gpg-agent whose home lies in this session's temporary
    directories. (After each module, not each test: a look at every process after each of
    ~1,400 tests was seconds of the suite's CPU; the agents are idle and their homes apart.)"""
    yield
    base = str(tmp_path_factory.getbasetemp())
    table = cmdlines()
    kill_pids([p for p in pids_mentioning(base, table) if b"gpg-agent" in table[p]])


@pytest.fixture(scope="session")
def gnupg() -> dict[str, str]:
    """Paths of the GnuPG tools; fails (never skips) when one is missing."""
    tools = {name: shutil.which(name) for name in ("gpg", "gpg-agent", "gpgconf")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        pytest.fail(f"GnuPG is required for these tests; missing: {', '.join(missing)}")
    return {name: str(path) for name, path in tools.items()}


@pytest.fixture(scope="session")
def keys(gnupg: dict[str, str], tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[KeyMaker]:
    """Test keys, each generated once per run (shared by the test processes of ``-n``)."""
    # Imported here, not at the top: a source module that fails to import breaks only the
    # tests that use this fixture, not the collection of every test.
    from workers.agents.gpg import GpgAgent

    home = short_tmpdir("sk")
    agent = GpgAgent(home)
    try:
        agent.start()
        pid = agent.pid
        # Under pytest-xdist every process's base temp dir sits in one directory of the run.
        run_dir = tmp_path_factory.getbasetemp()
        shared = (run_dir.parent if os.environ.get("PYTEST_XDIST_WORKER") else run_dir)
        yield KeyMaker(home, agent, shared / "test-keys")
    finally:
        agent.stop()
        shutil.rmtree(home, ignore_errors=True)
    assert pid_gone(pid)
