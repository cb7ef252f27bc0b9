"""The HTTP hardening of `server.runtime.httpproto` against a real `stampd serve`, and the stamper's
durable failure (`server.stamping.stamper.Stamper._failed`) on a real SQLite journal.

- Bytes the HTTP parser rejects, pipelined after valid requests, are answered in order: the
  valid requests' answers first, then ``400`` with ``connection: close``, then the close.
  uvicorn on its own answers the 400 at once and drops the answers owed before it.
- A process holds at most `connection_limit` client connections: more idle connections than
  its RLIMIT_NOFILE allows close the oldest idle ones, and a normal client is still served.
- A stamp told 'failed' is already committed as failed when the error reaches the caller.

The servers run with ``--no-workers``: nothing here signs, and ``GET /healthz`` needs no worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import select
import shutil
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select as sql_select

from formats.jobs import Job
from formats.keys import PRIMARY, ServedKey
from server import db
from server.dispatch import Signed, WorkerView
from server.errors import SigningFailed, StampError, Unavailable
from server.models import Stamp, StampState
from server.runtime.httpproto import MAX_HEAD, InvalidRequestLog, connection_limit
from server.stamping.journal import Journal
from server.stamping.requests import DigestRequest, TagRequest
from server.stamping.stamper import Stamper
from tests.helpers import TEST_FPR, TEST_UID, Server, migrated_sqlite, seed_data_dir, start_server

IO_TIMEOUT = 15.0  # seconds a socket read may take before the server is taken to hang
GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
GET_HEALTHZ_CLOSE = b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


# -- a live server and raw HTTP/1.1 on a socket ------------------------------------------------


def wait_healthy(server: Server, timeout: float = 60) -> None:
    """Until ``GET /healthz`` answers 200 (``wait_ready`` wants workers; these servers have
    none)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"stampd exited with {server.proc.returncode}:\n{server.log()}")
        with contextlib.suppress(OSError, AssertionError):
            if exchange(server.port, GET_HEALTHZ_CLOSE, timeout=2)[0].status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"stampd not healthy after {timeout}s:\n{server.log()}")


def start_bare_server(data_dir: Path, extra_env: dict[str, str] | None = None) -> Server:
    """`stampd serve --no-workers` on loopback, not waited for."""
    return start_server(seed_data_dir(data_dir), workers=1, args=("--no-workers",),
                        wait=False, extra_env=extra_env)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_bare_server(tmp_path_factory.mktemp("http") / "data")
    try:
        wait_healthy(server)
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.runtime_dir, ignore_errors=True)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def parse_answers(data: bytes) -> list[Answer]:
    """HTTP/1.1 responses back to back (each framed by Content-Length), in order; anything
    that is not a whole response is an assertion error."""
    answers = []
    rest = data
    while rest:
        head, sep, rest = rest.partition(b"\r\n\r\n")
        assert sep, f"a response cut short: {head!r}"
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, status, _ = status_line.split(" ", 2)
        assert version == "HTTP/1.1", status_line
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        assert "transfer-encoding" not in headers, headers
        length = int(headers["content-length"])
        assert len(rest) >= length, f"a body cut short: {rest!r}"
        answers.append(Answer(int(status), headers, rest[:length]))
        rest = rest[length:]
    return answers


def exchange(port: int, payload: bytes, timeout: float = IO_TIMEOUT) -> list[Answer]:
    """Send ``payload`` at once on a new connection and read until the server closes it
    (bounded by ``timeout``: a server that neither answers nor closes fails the test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        deadline = time.monotonic() + timeout
        data = b""
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no close within {timeout}s; got {data!r}") from None
            except ConnectionResetError:
                raise AssertionError(f"connection reset by the server; got {data!r}") from None
            if not chunk:
                return parse_answers(data)
            data += chunk


def statuses(answers: list[Answer]) -> list[int]:
    return [a.status for a in answers]


# Bytes httptools refuses: a NUL where a method belongs, a header line without a colon, a
# chunk size that is not hex (the request's headers are fine; its body is not).
GARBAGE = {
    "nul": b"\x00garbage\r\n\r\n",
    "header": b"GET /healthz HTTP/1.1\r\nHost t\r\n\r\n",
    "chunk": b"POST /healthz HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


def assert_400_close(answer: Answer) -> None:
    assert answer.status == 400, answer
    assert answer.headers.get("connection") == "close", answer.headers


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_alone_is_answered_400_and_closed(http_server: Server, garbage: bytes) -> None:
    answers = exchange(http_server.port, garbage)
    assert statuses(answers) == [400], answers
    assert_400_close(answers[0])


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
@pytest.mark.parametrize("valid", [1, 2])
def test_pipelined_garbage_is_answered_after_the_requests_before_it(
        http_server: Server, valid: int, garbage: bytes) -> None:
    # One segment: the parser rejects the garbage while the first request is still being
    # answered. Plain uvicorn answers 400 first and closes, and the 200s never come.
    answers = exchange(http_server.port, GET_HEALTHZ * valid + garbage)
    assert statuses(answers) == [200] * valid + [400], answers
    assert all(a.body == b"ok\n" for a in answers[:valid]), answers
    assert all("connection" not in a.headers for a in answers[:valid]), answers
    assert_400_close(answers[-1])


def test_nothing_after_the_garbage_is_answered(http_server: Server) -> None:
    answers = exchange(http_server.port, GET_HEALTHZ + GARBAGE["nul"] + GET_HEALTHZ)
    assert statuses(answers) == [200, 400], answers
    assert_400_close(answers[-1])


def test_the_connection_is_kept_after_a_good_request(http_server: Server) -> None:
    # The 400 path did not break ordinary keep-alive: two requests, two answers, no close
    # until the client asks for it.
    answers = exchange(http_server.port, GET_HEALTHZ + GET_HEALTHZ_CLOSE)
    assert statuses(answers) == [200, 200], answers
    assert "connection" not in answers[0].headers, answers


# -- the size of a request's head and HEAD ---------------------------------------------------

def _head_of(size: int, *, one_header: bool) -> bytes:
    """A GET /healthz whose request line and headers take about ``size`` bytes: many headers,
    or one long one (httptools keeps a header whole until it ends)."""
    start = b"GET /healthz HTTP/1.1\r\nHost: t\r\n"
    if one_header:
        return start + b"X-Pad: " + b"a" * size + b"\r\n\r\n"
    line = b"X-Pad: " + b"a" * 90 + b"\r\n"
    return start + line * (size // len(line)) + b"\r\n"


@pytest.mark.parametrize("one_header", [False, True], ids=["many", "one"])
def test_a_request_head_beyond_the_limit_is_answered_431_and_closed(
        http_server: Server, one_header: bool) -> None:
    assert statuses(exchange(http_server.port, _head_of(60_000, one_header=one_header)
                             + GET_HEALTHZ_CLOSE)) == [200, 200]
    answers = exchange(http_server.port, GET_HEALTHZ + _head_of(MAX_HEAD + 1000,
                                                                one_header=one_header))
    assert statuses(answers) == [200, 431], answers
    assert answers[-1].headers.get("connection") == "close", answers[-1].headers


def _answered_early_then_rest(port: int, head: bytes, body: bytes, after: bytes) -> list[Answer]:
    """Send ``head`` and a first KiB of ``body``, wait until the server has answered, then
    send the rest of the body and ``after`` on the same connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT) as sock:
        sock.sendall(head + body[:1024])
        data = b""
        while b"\r\n\r\n" not in data:  # (the early answer's head)
            chunk = sock.recv(65536)
            assert chunk, f"closed before an answer; got {data!r}"
            data += chunk
        sock.sendall(body[1024:] + after)
        deadline = time.monotonic() + IO_TIMEOUT
        while chunk := sock.recv(65536):
            data += chunk
            assert time.monotonic() < deadline, f"no close within {IO_TIMEOUT}s; got {data!r}"
    return parse_answers(data)


@pytest.mark.parametrize(("path", "status"), [("/add-checkpoint", 404), ("/v1/stamps", 415)])
def test_a_body_arriving_after_an_early_answer_is_no_head(
        http_server: Server, path: str, status: int) -> None:
    """A request answered before its body was read (no witness here; a wrong Content-Type):
    the body still arriving is read and dropped, and it is not counted as the next request's
    head (it was, and more than `MAX_HEAD` bytes of it drew a 431 schemathesis saw)."""
    n = 4 * MAX_HEAD
    head = (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-nothing\r\n"
            f"Content-Length: {n}\r\n\r\n").encode()
    answers = _answered_early_then_rest(http_server.port, head, b"x" * n, GET_HEALTHZ_CLOSE)
    assert statuses(answers) == [status, 200], answers


def test_the_head_limit_holds_after_an_upgrade_request(http_server: Server) -> None:
    """After a request with ``Upgrade: h2c`` (served as HTTP/1.1, with or without a body), the
    next request's head is counted again."""
    for body in (b"", b"0123456789"):
        upgrade = (b"POST /healthz HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\n"
                   b"Upgrade: h2c\r\nContent-Length: " + str(len(body)).encode()
                   + b"\r\n\r\n" + body)
        answers = exchange(http_server.port, upgrade + _head_of(MAX_HEAD + 1000,
                                                                one_header=True))
        assert statuses(answers)[-1] == 431, answers


def test_head_is_get_without_the_body(http_server: Server) -> None:
    with socket.create_connection(("127.0.0.1", http_server.port), timeout=IO_TIMEOUT) as sock:
        sock.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep and body == b"", data
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert b"content-length: 3" in head.lower(), head  # GET's: "ok\n"
    assert b"x-content-type-options: nosniff" in head.lower(), head


def test_unparsable_requests_are_logged_once_a_minute() -> None:
    now = [0.0]
    log_filter = InvalidRequestLog(clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.WARNING, "", 0, msg, (), None)

    first = record(InvalidRequestLog.MESSAGE)
    assert log_filter.filter(first) and "0 more" in first.getMessage()
    assert [log_filter.filter(record(InvalidRequestLog.MESSAGE)) for _ in range(5)] == [False] * 5
    assert log_filter.filter(record("something else"))  # other warnings pass
    now[0] = 61.0
    later = record(InvalidRequestLog.MESSAGE)
    assert log_filter.filter(later) and "5 more" in later.getMessage()


# -- the connection limit ---------------------------------------------------------------------

NOFILE = 400  # the server's soft RLIMIT_NOFILE: room for 200 client connections
IDLE = 450  # idle connections opened: more than the server could hold in descriptors


def closed_by_server(socks: list[socket.socket]) -> list[bool]:
    """For each socket, whether the server has closed it: readable, and ``recv`` gives EOF.
    (Nothing was sent on them, so a readable socket has nothing else to read.)"""
    poller = select.poll()
    for s in socks:
        poller.register(s, select.POLLIN)
    readable = {fd for fd, _ in poller.poll(0)}
    out = []
    for s in socks:
        if s.fileno() in readable:
            assert s.recv(1, socket.MSG_PEEK) == b"", "the server sent something unasked"
            out.append(True)
        else:
            out.append(False)
    return out


def test_idle_connections_beyond_the_limit_close_the_oldest(
        tmp_path: Path, server_factory: list[Server]) -> None:
    server = start_bare_server(tmp_path / "data", extra_env={
        # Idle connections must outlive the test by far: the headers timeout closes none.
        "STAMPD_KEEPALIVE_TIMEOUT": "600"})
    server_factory.append(server)
    # Before the first connection, which is when the server reads its limit.
    _, hard = resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (NOFILE, hard))
    limits = Path(f"/proc/{server.proc.pid}/limits").read_text()
    assert any(line.startswith("Max open files") and line.split()[3] == str(NOFILE)
               for line in limits.splitlines()), limits
    limit = connection_limit(NOFILE)
    assert limit == 200
    wait_healthy(server)

    socks: list[socket.socket] = []
    try:
        for _ in range(IDLE):
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        # A normal client is served: without the limit the server has no descriptor left to
        # accept it with (EMFILE), and it would wait here until the timeout.
        answers = exchange(server.port, GET_HEALTHZ_CLOSE)
        assert statuses(answers) == [200] and answers[0].body == b"ok\n", answers

        # The oldest idle connections are closed to make room: one for every connection
        # beyond the limit (the healthz one counted).
        beyond = IDLE + 1 - limit
        deadline = time.monotonic() + IO_TIMEOUT
        while sum(closed := closed_by_server(socks)) < beyond:
            assert time.monotonic() < deadline, (
                f"only {sum(closed)} of {IDLE} idle connections closed, want {beyond}:\n"
                f"{server.log()}")
            time.sleep(0.05)

        # Still serving, answers still in order (this connection fits under the limit).
        assert statuses(exchange(server.port, GET_HEALTHZ + GARBAGE["nul"])) == [200, 400]

        # Settled now (the server has since answered a whole exchange): exactly the oldest
        # were closed, no more than needed (one more if a closed healthz connection was still
        # counted when the first idle ones arrived), and the newest are open.
        closed = closed_by_server(socks)
        n = sum(closed)
        assert closed == [True] * n + [False] * (IDLE - n), (
            f"not the oldest closed: {''.join('x' if c else '.' for c in closed)}")
        assert beyond <= n <= beyond + 1, f"{n} idle connections closed, want {beyond}"

        # One warning (at most one a minute) says why connections were closed.
        log = server.log()
        assert log.count(f"connection limit {limit} reached") == 1, log
        assert "Traceback" not in log, log
    finally:
        for s in socks:
            s.close()


# -- a failure is committed before the caller hears of it --------------------------------------

KEY = ServedKey(PRIMARY, "openpgp", TEST_FPR, "eddsa (ed25519)", "pub", TEST_UID, primary=True)
REQUEST_TIMEOUT = 0.2  # seconds the stamper waits for a signature


class FailingDispatcher:
    """The `server.dispatch.Dispatcher` protocol with no worker behind it: ``sign`` raises
    ``error``, or never answers when ``error`` is None. (The dispatcher is not under test.)"""

    requeued = 0

    def __init__(self, error: BaseException | None) -> None:
        self.error = error
        self.calls = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    @property
    def workers(self) -> Mapping[str, WorkerView]:
        return {}

    @property
    def queue_depth(self) -> int:
        return 0

    def keys_served(self) -> set[str]:
        return {PRIMARY}

    async def sign(self, job: Job, key: str = PRIMARY, *, internal: bool = False) -> Signed:
        self.calls += 1
        if self.error is None:
            await asyncio.Event().wait()
        assert self.error is not None
        raise self.error


FAILURES = {
    # what the dispatcher does: (what the caller gets, the error recorded)
    "unavailable": (Unavailable("no live worker holds key primary"), Unavailable,
                    "no live worker holds key primary"),
    "signing-failed": (SigningFailed("gpg said no"), SigningFailed, "gpg said no"),
    "never-answers": (None, Unavailable, "timed out"),
    "crash": (RuntimeError("socket gone"), RuntimeError, "RuntimeError: socket gone"),
}


@pytest.mark.parametrize("kind", ["tag", "digest"])
@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
def test_a_failed_stamp_is_committed_as_failed_before_the_error_is_raised(
        tmp_path: Path, kind: str,
        failure: tuple[BaseException | None, type[BaseException], str]) -> None:
    error, raised, recorded = failure
    url = migrated_sqlite(tmp_path / "journal.sqlite3")
    engine = db.make_engine(url)
    observer = db.make_engine(url)  # another engine: its own connection, nothing shared

    def row_now() -> list[tuple[str, str | None]]:
        with observer.connect() as conn:
            rows = conn.execute(sql_select(Stamp.state, Stamp.error)).all()
        return [(r.state, r.error) for r in rows]

    async def scenario() -> tuple[BaseException, list[tuple[str, str | None]]]:
        journal = Journal(engine)
        journal.start()
        dispatcher = FailingDispatcher(error)
        stamper = Stamper(journal, dispatcher, [KEY], public_url="http://stampd.invalid/",
                          request_timeout=REQUEST_TIMEOUT, clock=lambda: 1_795_400_000.0)
        try:
            if kind == "tag":
                await stamper.stamp(TagRequest("a" * 40, "v1"))
            else:
                await stamper.stamp(DigestRequest("sha256", "b" * 64))
        except (StampError, RuntimeError) as e:
            # Read at once, before this coroutine yields: the event loop can run no journal
            # write or timer in between; only what `_failed` awaited is committed.
            rows = row_now()
            caught: BaseException = e
        else:
            raise AssertionError("the stamp did not fail")
        finally:
            await journal.stop()
        assert dispatcher.calls == 1
        return caught, rows

    try:
        caught, rows = asyncio.run(scenario())
    finally:
        observer.dispose()
        engine.dispose()
    assert type(caught) is raised, repr(caught)
    assert rows == [(StampState.FAILED, recorded)]
