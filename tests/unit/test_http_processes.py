"""The parts of several HTTP processes that need no server: the worker's connections to every
dispatcher, the log lock among processes, the counters they add up, the HTTP manager's
configuration."""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from formats.jobs import FrameBuffer, decode_frame, frame
from server.api.processes import ApiManagerConfig, listeners
from server.leadership import FileLeader
from server.stats import Stats
from tests.helpers import short_tmpdir
from workers.link import Dispatchers


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


def _next(d: Dispatchers, timeout: float = 5.0) -> tuple[Path, list[dict[str, object]]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = d.next_jobs(0.2)
        if found is not None:
            return found
    raise AssertionError("no job came")


def test_a_worker_serves_every_dispatcher_and_reconnects_to_a_restarted_one(base: Path) -> None:
    paths = (base / "a.sock", base / "b.sock")
    servers = [_listen(p) for p in paths]
    d = Dispatchers(paths, frame({"hello": 1}), "w")
    d.connect(time.monotonic() + 5)
    conns = [s.accept()[0] for s in servers]
    assert [_hello(c) for c in conns] == [{"hello": 1}, {"hello": 1}]

    # A job from each comes from that one, and its answer goes back there.
    for i, conn in enumerate(conns):
        conn.sendall(frame({"id": i}))
        path, messages = _next(d)
        assert (path, messages) == (paths[i], [{"id": i}])
        d.answer(path, frame({"id": i, "object": "x"}))
        assert decode_frame(conn.recv(4096)[4:]) == {"id": i, "object": "x"}
    # The jobs that arrived together on one connection come together; the next call takes
    # the other connection's (in turn, so that neither waits behind the other).
    conns[0].sendall(frame({"id": 3}) + frame({"id": 4}))
    conns[1].sendall(frame({"id": 5}))
    time.sleep(0.1)
    first, second = _next(d), _next(d)
    assert sorted([first, second]) == [(paths[0], [{"id": 3}, {"id": 4}]),
                                       (paths[1], [{"id": 5}])]

    # Dispatcher b goes away (its process died): a is still served, b is tried again.
    conns[1].close()
    servers[1].close()
    paths[1].unlink()
    conns[0].sendall(frame({"id": 7}))
    assert _next(d) == (paths[0], [{"id": 7}])
    assert list(d.links) == [paths[0]] and paths[1] in d.lost
    servers[1] = _listen(paths[1])  # restarted
    d.answer(paths[0], frame({"id": 7, "object": "y"}))
    deadline = time.monotonic() + 5
    while paths[1] not in d.links and time.monotonic() < deadline:
        d.next_jobs(0.2)
    assert paths[1] in d.links
    again = servers[1].accept()[0]
    assert _hello(again) == {"hello": 1}
    again.sendall(frame({"id": 8}))
    assert _next(d) == (paths[1], [{"id": 8}])
    d.close()
    for s in [*servers, *conns, again]:
        s.close()


def test_a_worker_starts_with_the_dispatchers_that_answer(base: Path) -> None:
    paths = (base / "a.sock", base / "b.sock")
    server = _listen(paths[1])
    d = Dispatchers(paths, frame({"hello": 1}), "w")
    d.connect(time.monotonic() + 5)
    assert list(d.links) == [paths[1]] and list(d.lost) == [paths[0]]
    d.close()
    server.close()
    with pytest.raises(FileNotFoundError):
        Dispatchers((base / "none.sock",), b"", "w").connect(time.monotonic() + 0.2)


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
