"""The parts of several HTTP processes that need no server: the worker's connection to the
host's dispatcher, the log lock among processes, the counters they add up, the HTTP manager's
configuration."""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from formats.frames import FrameBuffer, decode_frame, frame
from server.http_processes import ApiManagerConfig, listeners
from server.leadership import FileLeader
from server.stats import Stats
from tests.helpers import short_tmpdir
from workers.link import DispatcherLink


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory with a short path, for Unix sockets."""
    path = short_tmpdir("dp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _listen(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(4)
    return s


def _hello(conn: socket.socket) -> dict[str, object]:
    buf = FrameBuffer(1 << 20)
    while (message := buf.next()) is None:
        buf.feed(conn.recv(4096))
    return message


def _next(d: DispatcherLink, timeout: float = 5.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = d.next_jobs(0.2)
        if found is not None:
            return found
    raise AssertionError("no job came")


def test_a_worker_takes_jobs_from_the_hosts_dispatcher_and_reconnects_when_it_is_back(
        base: Path) -> None:
    path = base / "dispatch.sock"
    server = _listen(path)
    d = DispatcherLink(path, frame({"hello": 1}), "w")
    d.connect(time.monotonic() + 5)
    conn = server.accept()[0]
    assert _hello(conn) == {"hello": 1}

    # A job comes, and its answer goes back; the jobs that arrived together come together.
    conn.sendall(frame({"id": 1}))
    assert _next(d) == [{"id": 1}]
    d.answer(frame({"id": 1, "object": "x"}))
    assert decode_frame(conn.recv(4096)[4:]) == {"id": 1, "object": "x"}
    conn.sendall(frame({"id": 3}) + frame({"id": 4}))
    got = _next(d)
    got += [] if len(got) == 2 else _next(d)
    assert got == [{"id": 3}, {"id": 4}]

    # The dispatcher goes away (the server restarts): the worker tries again until it is back.
    conn.close()
    server.close()
    path.unlink()
    assert d.next_jobs(1.0) is None and not d.connected
    d.answer(frame({"id": 4, "object": "y"}))  # (nowhere to go: dropped)
    server = _listen(path)
    deadline = time.monotonic() + 5
    while not d.connected and time.monotonic() < deadline:
        d.next_jobs(0.2)
    assert d.connected
    again = server.accept()[0]
    assert _hello(again) == {"hello": 1}
    again.sendall(frame({"id": 8}))
    assert _next(d) == [{"id": 8}]
    d.close()
    for s in (server, again):
        s.close()


def test_a_worker_waits_for_its_dispatcher_a_bounded_time(base: Path) -> None:
    with pytest.raises(FileNotFoundError):
        DispatcherLink(base / "none.sock", b"", "w").connect(time.monotonic() + 0.2)


def test_one_log_writer_among_processes_until_it_lets_go(tmp_path: Path) -> None:
    lock = tmp_path / "run" / "log.lock"
    first, second = FileLeader(lock), FileLeader(lock)  # (flock: per open file, as per process)
    assert first() and first()
    assert not second()
    first.close()  # as when its process dies
    assert second() and not first()
    second.close()


def test_counters_of_several_processes_add_up() -> None:
    a, b = Stats(), Stats()
    a.request("tag", 200)
    a.signing["w0"].observe(0.001)
    b.request("tag", 200)
    b.request("digest", 400)
    b.signing["w0"].observe(0.002)
    b.journal_commit.observe(0.003)
    b.worker_disconnects = 2
    a.loop_lagged(0.2)
    b.loop_lagged(0.03)
    b.loop_lagged(0.001)
    total = a.plus([b.snapshot()])
    assert dict(total.requests) == {("tag", 200): 2, ("digest", 400): 1}
    assert sum(total.signing["w0"].counts) == 2
    assert total.signing["w0"].total == pytest.approx(0.003)
    assert sum(total.journal_commit.counts) == 1 and total.worker_disconnects == 2
    assert sum(total.loop_lag.counts) == 3 and total.loop_lag_max == 0.2  # (the max, not a sum)
    assert total.loop_lag.total == pytest.approx(0.231)
    assert dict(a.requests) == {("tag", 200): 1}  # (unchanged)


def test_http_manager_configuration_round_trip_and_refusals() -> None:
    config = ApiManagerConfig((5, 6), "INFO", {"port": 8080})
    assert ApiManagerConfig.from_json(config.to_json()) == config
    for bad in (b"", b"[]", b'{"listen_fds": [], "log_level": "INFO", "settings": {}}',
                b'{"listen_fds": ["x"], "log_level": "INFO", "settings": {}}',
                b'{"listen_fds": [3]}'):
        with pytest.raises(ValueError):
            ApiManagerConfig.from_json(bad)


def test_listeners_share_one_port() -> None:
    socks = listeners("127.0.0.1", 0, 3)
    try:
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1
        with socket.create_connection(("127.0.0.1", ports.pop()), timeout=5):
            pass
    finally:
        for s in socks:
            s.close()
