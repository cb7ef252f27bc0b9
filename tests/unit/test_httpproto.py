"""The connection limit of `server.runtime.httpproto`: how many client connections a process may
hold for its RLIMIT_NOFILE, and which connection is closed when one more arrives. (Against a
real server: tests/integration/test_http_hardening.py.)"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import uvicorn
from uvicorn.server import ServerState

from server.runtime import httpproto
from server.runtime.httpproto import FD_RESERVE, REPORT_EVERY, _Connections, connection_limit


@pytest.mark.parametrize(("nofile", "limit"), [
    (1024, 768),  # systemd's default: all but the reserve
    (65536, 65536 - FD_RESERVE),
    (513, 257),  # just above 2 * reserve: the reserve still decides
    (512, 256),
    (400, 200),  # a small limit: at least half the descriptors serve clients
    (300, 150),
    (1, 0),
])
def test_connection_limit(nofile: int, limit: int) -> None:
    assert connection_limit(nofile) == limit


def test_connection_limit_reads_the_soft_rlimit_by_default() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_limit() == connection_limit(soft)


def test_an_unlimited_rlimit_is_taken_as_a_million(monkeypatch: pytest.MonkeyPatch) -> None:
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(resource, "getrlimit", lambda _which: unlimited)
    assert connection_limit() == (1 << 20) - FD_RESERVE


# -- which connection is closed for a new one ---------------------------------------------------
# `_Connections` touches of a connection only its transport's close() and its loop's clock;
# these stand in for uvicorn's transport and event loop.


@dataclass
class Clock:
    now: float = 1000.0

    def time(self) -> float:
        return self.now


@dataclass
class Transport:
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass(eq=False)
class Conn:
    loop: Clock
    transport: Transport = field(default_factory=Transport)


class Server:
    """What `StampdHttpProtocol` tells its server's `_Connections`, for plain connections."""

    def __init__(self, limit: int) -> None:
        self.limits = _Connections(limit)
        self.clock = Clock()
        self.open: list[Conn] = []

    def connect(self) -> Conn:
        conn = Conn(self.clock)
        self.open.append(conn)
        proto = cast(Any, conn)
        self.limits.waiting(proto)  # as connection_made: no whole request yet
        self.limits.admit(proto, len(self.open))
        self.open = [c for c in self.open if not c.transport.closed]  # connection_lost
        return conn

    def request(self, conn: Conn) -> None:
        self.limits.busy(cast(Any, conn))  # a whole request, being answered

    def answered(self, conn: Conn) -> None:
        self.limits.waiting(cast(Any, conn), answered=True)  # idle until the next request


def test_the_oldest_idle_connection_makes_room() -> None:
    s = Server(limit=3)
    a, b, c = s.connect(), s.connect(), s.connect()
    assert not any(x.transport.closed for x in (a, b, c))  # at the limit, not beyond
    d = s.connect()
    assert a.transport.closed and not d.transport.closed
    assert (s.limits.evicted, s.limits.refused) == (1, 0)
    assert s.open == [b, c, d]


def test_a_connection_being_answered_is_never_closed_for_room() -> None:
    s = Server(limit=3)
    a, b, c = s.connect(), s.connect(), s.connect()
    s.request(a)
    d = s.connect()
    assert not a.transport.closed and b.transport.closed
    # Idle again after its answer: the most recently idle, so the last to go.
    s.answered(a)
    e = s.connect()
    assert c.transport.closed and not a.transport.closed
    f = s.connect()
    assert d.transport.closed
    assert s.open == [a, e, f]


def test_a_flood_of_silent_connections_closes_them_before_an_answered_clients() -> None:
    """A normal client idle between two of its requests keeps its connection while connections
    that never sent a request come and go (`bench.slow`'s flood closed it once); when only
    answered ones are left, the oldest of those goes."""
    s = Server(limit=3)
    a = s.connect()
    s.request(a)
    s.answered(a)
    b = s.connect()
    for _ in range(20):
        s.connect()
    assert not a.transport.closed and b.transport.closed
    c = s.open[-1]
    s.request(c)
    s.answered(c)  # (now two answered, one silent: the silent one goes first)
    s.connect()
    assert not a.transport.closed and not c.transport.closed
    s.request(s.open[-1])
    s.answered(s.open[-1])
    s.connect()  # (only answered ones left to close: the oldest, a)
    assert a.transport.closed and not c.transport.closed


def test_when_every_connection_is_being_answered_the_new_one_is_refused() -> None:
    s = Server(limit=2)
    a, b = s.connect(), s.connect()
    s.request(a)
    s.request(b)
    c = s.connect()
    assert c.transport.closed and not a.transport.closed and not b.transport.closed
    assert (s.limits.evicted, s.limits.refused) == (0, 1)
    assert s.open == [a, b]


def test_one_warning_a_minute_while_the_limit_is_hit(caplog: pytest.LogCaptureFixture) -> None:
    s = Server(limit=1)
    s.connect()
    with caplog.at_level(logging.WARNING, logger=httpproto.__name__):
        for _ in range(50):
            s.connect()
        s.clock.now += REPORT_EVERY - 1
        s.connect()
        assert len(caplog.records) == 1
        assert "connection limit 1 reached" in caplog.records[0].getMessage()
        s.clock.now += 1
        s.connect()
    assert len(caplog.records) == 2
    assert "52 connections without a whole request closed" in caplog.records[1].getMessage()


def test_without_the_protocol_answers_and_bodies_go_through_asgi() -> None:
    """`respond` sends ASGI messages and `whole_body` declines when no uvicorn cycle is in the
    scope (the system tests cover the direct path: every server they start uses it)."""
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "http", "method": "POST", "headers": []}
    asyncio.run(httpproto.respond(scope, send, 406, [(b"content-type", b"text/plain")], b"no\n"))
    assert sent == [
        {"type": "http.response.start", "status": 406,
         "headers": [(b"content-type", b"text/plain"), (b"content-length", b"3")]},
        {"type": "http.response.body", "body": b"no\n"},
    ]
    assert httpproto.whole_body(scope, 1000) is None


# -- the head limit counts heads, not the end of a body ---------------------------------------


async def _early_413(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that answers a POST 413 without reading its body (as stampd does for a
    Content-Length beyond its limit), and anything else 200."""
    if scope["type"] != "http":
        return
    status = 413 if scope["method"] == "POST" else 200
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def _read_until_closed(sock: socket.socket, loop: asyncio.AbstractEventLoop) -> bytes:
    data = b""
    while chunk := await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 10):
        data += chunk
    return data


async def _body_end_then_request(rest: int) -> list[int]:
    """A POST answered early, the last ``rest`` bytes of its body read by the server in one
    piece on their own (the client's next request comes after), then a GET: the statuses."""
    loop = asyncio.get_running_loop()
    config = uvicorn.Config(_early_413, lifespan="off", log_level="critical")
    config.load()
    state = ServerState()
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    await loop.connect_accepted_socket(
        lambda: httpproto.StampdHttpProtocol(config, state, {}, loop), ours)
    body = 1024 + rest
    await loop.sock_sendall(theirs, b"POST / HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n"
                            b"Content-Length: %d\r\n\r\n" % body + b"x" * 1024)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += await asyncio.wait_for(loop.sock_recv(theirs, 1 << 16), 10)
    # The rest of the body goes into the socket while the loop does not run, so that the
    # server reads it in one piece (a loaded server reads less often, in larger pieces).
    theirs.setblocking(True)
    theirs.sendall(b"x" * rest)
    theirs.setblocking(False)
    for _ in range(3):
        await asyncio.sleep(0)  # the loop reads the piece
    await loop.sock_sendall(theirs, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    answer += await _read_until_closed(theirs, loop)
    theirs.close()
    return [int(line.split()[1]) for line in answer.split(b"\r\n")
            if line.startswith(b"HTTP/1.1 ")]


@pytest.mark.parametrize("rest", [1000, 2 * httpproto.MAX_HEAD])
def test_the_end_of_a_body_answered_early_is_no_head(rest: int) -> None:
    """The last piece of a body that was answered before it arrived ended the request; the
    bytes of that piece were counted as the next request's head, and more than `MAX_HEAD` of
    them drew a 431 that the client's next request read as its answer (schemathesis, on a
    loaded machine)."""
    assert asyncio.run(_body_end_then_request(rest)) == [413, 200]
