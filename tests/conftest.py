"""Shared fixtures: real servers as subprocesses, a fixed test key, the local PostgreSQL,
GnuPG and generated test keys. Helpers (no fixtures) are in tests/helpers.py.

Tests are in three folders: unit/ (pure code), integration/ (real agents, git, databases,
in-process components) and system/ (whole servers as subprocesses, marked ``slow``). Every test
that uses the local PostgreSQL (the ``pg_url`` fixture) is marked ``postgres``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    TEST_UID,
    KeyMaker,
    Server,
    ThrowawayPostgres,
    kill_pids,
    pid_gone,
    pids_mentioning,
    postgres_bindir,
    proc_cmdline,
    seed_data_dir,
    short_tmpdir,
    start_server,
)

LONGEST_FIRST = ("system", "integration", "unit")

# RFC 3161 (on by default) adds a key, a worker and an agent to every server and worker host:
# the processes tests start run without it unless a test turns it on (tests/system/test_tsa*).
os.environ.setdefault("STAMPD_TSA", "false")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the local PostgreSQL ``postgres``, and run the slowest kinds
    of test first: with several test processes (``-n``), short tests then fill the gaps at the
    end instead of a long one starting last. (Order within a module is kept.)"""
    for item in items:
        if "pg_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)

    def kind(item: pytest.Item) -> int:
        parts = Path(item.path).parts
        return next((i for i, k in enumerate(LONGEST_FIRST) if k in parts), len(LONGEST_FIRST))

    items.sort(key=kind)


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


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A PostgreSQL server for the session: a throwaway cluster started from the installed
    server binaries (stopped at the end), or the server that ``STAMPD_TEST_PG_URL`` names
    (e.g. ``postgresql://postgres@127.0.0.1:5432/postgres``). Fails, never skips, when
    neither can be had."""
    given = os.environ.get("STAMPD_TEST_PG_URL")
    if given:
        yield given
        return
    bindir = postgres_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries are required (apt-get install postgresql), "
                    "or set STAMPD_TEST_PG_URL to a running server")
    cluster = ThrowawayPostgres(bindir)
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
               if b"gpg-agent" in proc_cmdline(p)])


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
