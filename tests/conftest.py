"""Shared fixtures: real servers as subprocesses, a fixed test key, the local PostgreSQL,
GnuPG and generated test keys. Helpers (no fixtures) are in tests/helpers.py.

Tests are in three folders: unit/ (pure code), integration/ (real agents, git, databases,
in-process components) and system/ (whole servers as subprocesses, marked ``slow``). Every test
that uses the local PostgreSQL (the ``pg_url`` fixture) is marked ``postgres``.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    PG_ADMIN_URL,
    TEST_UID,
    KeyMaker,
    Server,
    kill_pids,
    pid_gone,
    pids_mentioning,
    proc_cmdline,
    seed_data_dir,
    short_tmpdir,
    start_server,
)

LONGEST_FIRST = ("system", "integration", "unit")


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
def keys(gnupg: dict[str, str]) -> Iterator[KeyMaker]:
    """Test keys, each generated once per session."""
    # Imported here, not at the top: a source module that fails to import breaks only the
    # tests that use this fixture, not the collection of every test.
    from workers.agents.gpg import GpgAgent

    home = short_tmpdir("sk")
    agent = GpgAgent(home)
    try:
        agent.start()
        pid = agent.pid
        yield KeyMaker(home, agent)
    finally:
        agent.stop()
        shutil.rmtree(home, ignore_errors=True)
    assert pid_gone(pid)
