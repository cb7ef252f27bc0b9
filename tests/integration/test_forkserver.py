"""tests/forkserver.py runs ``python -m stampd`` as a fresh interpreter does: a server forked by
`start_server` and one started with subprocess.Popen exit alike (the status and the output of a
refused start, SIGTERM, SIGKILL) and pass on the environment they were given."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import helpers
from tests.helpers import ForkedProcess, ForkServer, seed_data_dir, start_server


@pytest.fixture
def forks() -> Iterator[ForkServer]:
    """This test's own fork server, used by `start_server` while the test runs."""
    before, helpers.FORK_SERVER = helpers.FORK_SERVER, ForkServer()
    try:
        yield helpers.FORK_SERVER
    finally:
        helpers.FORK_SERVER.close()
        helpers.FORK_SERVER = before


def _refused(data: Path, forks: ForkServer | None) -> tuple[int, str, bool]:
    before, helpers.FORK_SERVER = helpers.FORK_SERVER, forks
    try:
        server = start_server(data, wait=False, port=99999)
    finally:
        helpers.FORK_SERVER = before
    code = server.proc.wait(timeout=60)
    return code, server.log(), isinstance(server.proc, ForkedProcess)


def test_a_refused_start_exits_as_a_fresh_interpreter(tmp_path: Path,
                                                      forks: ForkServer) -> None:
    forked = _refused(seed_data_dir(tmp_path / "a"), forks)
    fresh = _refused(seed_data_dir(tmp_path / "b"), None)
    assert forked[2] and not fresh[2]
    assert forked[:2] == fresh[:2]
    assert forked[0] == 2 and forked[1].startswith("stampd serve: ") and forked[1].count(
        "\n") == 1, forked[1]


def test_a_forked_server_serves_with_its_environment_and_stops(tmp_path: Path,
                                                               forks: ForkServer) -> None:
    data = seed_data_dir(tmp_path / "data")
    server = start_server(data, workers=1)
    try:
        assert isinstance(server.proc, ForkedProcess)
        with urllib.request.urlopen(server.url + "readyz", timeout=10) as r:
            assert r.status == 200
        # its workers inherited the environment start_server gave it (STAMPD_RUNTIME_DIR)
        assert len(server.worker_pids()) == 1
    finally:
        assert server.stop() == 0
    again = start_server(data, workers=1)
    try:
        again.proc.send_signal(signal.SIGKILL)
        assert again.proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        again.stop()
