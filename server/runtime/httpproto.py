"""uvicorn's httptools protocol, hardened against idle and slow clients.

uvicorn arms its keep-alive timer only after a response. A connection that never sends a
request, or sends its headers a byte at a time, would stay open forever. Here a connection must
deliver complete request headers within ``timeout_keep_alive`` seconds of connecting or of the
previous response; the body has its own timeout in `server.api.body.read_body`.

Timeouts alone do not bound the number of connections: a client that opens more of them within
a timeout than the process may open files (``RLIMIT_NOFILE``; 1024 under systemd's default)
takes every descriptor, and then the event loop accepts and drops every new connection, the
normal clients' too, and the database and the workers cannot open files either (`bench.slow`
shows it). So a process holds at most `connection_limit` client connections, its soft
``RLIMIT_NOFILE`` less `FD_RESERVE` for everything else. A connection beyond it closes the
oldest connection that has not delivered a whole request, which costs no client an answer
(nginx reuses idle connections the same way): first one that has never delivered any (it sent
nothing, or its first headers or body are still arriving), then an idle keep-alive one that
has been answered before, so that a flood of connections that send nothing does not close a
normal client's connection between two of its requests (`bench.slow` saw it); only when every
connection holds a request being served is the new one closed instead.

The hot path (`server.api.zeitgitter`) takes a body that has arrived whole and writes its answer
in one piece, straight to the connection (`whole_body`, `respond`), instead of through ASGI's
``receive`` and two ``send`` messages: the protocol puts the request's uvicorn cycle into its
scope (`CYCLE`). Outside this protocol (no cycle in the scope) both fall back to ASGI.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import resource
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import httptools
from starlette.types import Scope, Send
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

log = logging.getLogger(__name__)

# Descriptors a process keeps for all but client connections: database files and connections
# (SQLite: 3 files per connection), the log repository, the workers' sockets, the event loop's
# own, threads' files, peers.
FD_RESERVE = 256
REPORT_EVERY = 60.0  # seconds between warnings while the limit is being hit
# The most bytes a request line and its headers may take: beyond it the answer is 431 and the
# connection closes (httptools keeps a header whole in memory until it ends).
MAX_HEAD = 64 * 1024
TOO_LARGE = "Request header fields too large."
LINGER = 2.0  # seconds a connection closed with an error answer still reads (and drops)
CYCLE = "stampd.cycle"  # scope key: a weak reference to the uvicorn cycle serving the request


def connection_limit(nofile: int | None = None) -> int:
    """Client connections one process may hold, given its soft ``RLIMIT_NOFILE`` (by default
    the current one): all but `FD_RESERVE` descriptors, and at least half of them."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY:
            nofile = 1 << 20
    return max(nofile // 2, nofile - FD_RESERVE)


class _Connections:
    """The connection limit of one server, and its connections that have not delivered a
    whole request, oldest first (those may be closed to make room): those never answered
    (``fresh``) before those idle after an answer (``kept``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.fresh: OrderedDict[StampdHttpProtocol, None] = OrderedDict()
        self.kept: OrderedDict[StampdHttpProtocol, None] = OrderedDict()
        self.evicted = 0
        self.refused = 0
        self._reported_at: float | None = None

    def waiting(self, proto: StampdHttpProtocol, answered: bool = False) -> None:
        """``proto`` waits for a whole request: a new connection, or (``answered``) one idle
        after an answer."""
        self.busy(proto)
        (self.kept if answered else self.fresh)[proto] = None

    def busy(self, proto: StampdHttpProtocol) -> None:
        self.fresh.pop(proto, None)
        self.kept.pop(proto, None)

    def admit(self, proto: StampdHttpProtocol, open_connections: int) -> None:
        """Make room for ``proto`` if it is one too many (called once it is counted)."""
        if open_connections <= self.limit:
            return
        victim = next((p for p in itertools.chain(self.fresh, self.kept) if p is not proto),
                      proto)
        if victim is proto:
            self.refused += 1
        else:
            self.evicted += 1
        self.busy(victim)
        victim.transport.close()
        now = proto.loop.time()
        if self._reported_at is None or now - self._reported_at >= REPORT_EVERY:
            self._reported_at = now
            log.warning("connection limit %d reached: %d connections without a whole request "
                        "closed, %d new ones refused so far (the limit is RLIMIT_NOFILE less "
                        "%d; raise LimitNOFILE= / ulimit -n for more)", self.limit,
                        self.evicted, self.refused, FD_RESERVE)


class InvalidRequestLog(logging.Filter):
    """uvicorn logs a warning for every unparsable request (a scanner or a fuzzer makes
    thousands): let one through per `REPORT_EVERY` seconds, counting the ones held back."""

    MESSAGE = "Invalid HTTP request received."

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.held = 0
        self.last: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != self.MESSAGE:
            return True
        now = self.clock()
        if self.last is not None and now - self.last < REPORT_EVERY:
            self.held += 1
            return False
        record.msg = (f"invalid HTTP request received (answered 400); {self.held} more since "
                      "the last such message, which comes at most once a minute")
        record.args = ()
        self.held, self.last = 0, now
        return True


_servers: weakref.WeakKeyDictionary[ServerState, _Connections] = weakref.WeakKeyDictionary()


def _connections_of(state: ServerState) -> _Connections:
    conns = _servers.get(state)
    if conns is None:
        conns = _servers[state] = _Connections(connection_limit())
    return conns


_on_shutdown: list[Callable[[], None]] = []


def on_shutdown(hook: Callable[[], None]) -> Callable[[], None]:
    """Call ``hook`` when the server begins to stop (uvicorn asks each connection to finish):
    requests that would wait on (proof waiters) answer now rather than hold the stop up.
    Returns what removes the hook."""
    _on_shutdown.append(hook)
    return lambda: _on_shutdown.remove(hook) if hook in _on_shutdown else None


def open_connections() -> int:
    """The client connections this process holds (over every server it runs)."""
    return sum(len(state.connections) for state in list(_servers))


class StampdHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._headers_deadline: float | None = None
        self._limit = _connections_of(self.server_state)
        self._owed_error: tuple[int, str] | None = None
        self._head_bytes = 0  # received while waiting for the current request's headers
        self._head_size = 0  # request line and headers of the request being parsed
        self._head_too_large = False
        # Between a request's headers and the end of its body: its body may still be arriving
        # after its answer went out (an early 413, 404 or 415), and those bytes are no head.
        self._in_body = False
        self._lingering = False  # answered an error; reading only to drop (see _write_error)
        self._upgrade_body_left = 0  # bytes of an Upgrade request's body still to come

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._arm_headers_timer()
        self._limit.waiting(self)
        self._limit.admit(self, len(self.connections))

    def connection_lost(self, exc: Exception | None) -> None:
        self._limit.busy(self)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        for hook in list(_on_shutdown):
            hook()
        super().shutdown()

    def _unsupported_upgrade_warning(self) -> None:
        """An ``Upgrade`` stampd does not speak (``h2c`` from HTTP/2-capable clients, a
        WebSocket): the request is answered as plain HTTP/1.1, which RFC 9110 allows, so it is
        no event worth a warning (uvicorn logged one, or two, per such request)."""

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the answer is sent; what comes now is dropped until the close
        if self._upgrade_body_left:
            data = self._upgrade_body(data)
            if not data:
                return
        # Only bytes that arrive while a head is awaited, before and after parsing them, are
        # counted as head: a piece that ends a body (answered early, before it all came) is
        # body, whatever its size.
        waiting = self._waiting_for_headers()
        self._parse(data)
        if waiting and self._waiting_for_headers():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                self._send_error(431, TOO_LARGE)
                return
            self._arm_headers_timer()
        else:
            self._headers_deadline = None

    def _parse(self, data: bytes) -> None:
        """uvicorn's ``data_received`` (0.54.0, pinned), but a request with an ``Upgrade``
        stampd does not speak (``h2c``) is served as the HTTP/1.1 request it also is, body
        included (RFC 9110 §7.8 lets a server ignore Upgrade). llhttp ends such a request at its
        headers and leaves the parser stopped, so uvicorn served it without its body (a POST
        with ``Upgrade: h2c`` arrived empty) and could parse nothing more on the connection."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade as e:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._despite_upgrade(data[int(e.args[0]):])

    def _despite_upgrade(self, rest: bytes) -> None:
        """Go on after an Upgrade request's headers as if there were no Upgrade: its body (by
        Content-Length) goes to its cycle, and a fresh parser takes what follows."""
        self.parser = httptools.HttpRequestParser(self)
        fields = dict(self.headers)
        if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
            self.send_400_response("a chunked body with an Upgrade header is not supported: "
                                   "send it without Upgrade, or with Content-Length")
            return
        length = int(fields.get(b"content-length", b"0") or 0)
        cycle = self.cycle
        if length and cycle is not None and not cycle.response_complete:
            cycle.more_body = True  # (llhttp had ended the message at its headers)
            self._upgrade_body_left = length
            rest = self._upgrade_body(rest)
        if not self._upgrade_body_left:
            self._in_body = False  # (no body to come: what follows is the next head)
        if rest:
            self._parse(rest)

    def _upgrade_body(self, data: bytes) -> bytes:
        """Hand the bytes of an Upgrade request's body to its cycle; what follows it."""
        take = data[: self._upgrade_body_left]
        self._upgrade_body_left -= len(take)
        if take:
            self.on_body(take)
        if self._upgrade_body_left == 0:
            self.on_message_complete()
        return data[len(take):]

    # The head's size is counted twice: bytes received while no request is being served (a
    # header still arriving, which httptools keeps whole), and the request line and headers
    # the parser hands over (those of pipelined requests, parsed while another is served).
    def on_message_begin(self) -> None:
        self._head_size = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count_head(self, n: int) -> None:
        self._head_size += n
        if self._head_size > MAX_HEAD:
            self._head_too_large = True
            raise ValueError("request head too large")  # httptools: a parser error

    def on_headers_complete(self) -> None:
        self._head_bytes = 0
        self._in_body = True
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # (an upgrade makes no cycle)
            # Weak: the cycle holds the scope, which would otherwise hold the cycle, a loop
            # per request that only the garbage collector frees.
            self.scope[CYCLE] = weakref.ref(cycle)  # type: ignore[literal-required]
            cycle.transport = _AnswerTransport(self)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()
        if self.cycle is not None and not self.cycle.response_complete:
            self._limit.busy(self)  # a whole request: it is served, never closed for room

    def send_400_response(self, msg: str) -> None:
        if self._head_too_large:  # (`_count_head` stopped the parser)
            self._send_error(431, TOO_LARGE)
        else:
            self._send_error(400, msg)

    def _send_error(self, status: int, msg: str) -> None:
        """Answer unparsable bytes (or too many of them) with ``status`` and close, but only
        after the answers owed to the complete requests pipelined before them: HTTP/1.1
        answers in order, and uvicorn would send the 400 first, as if it answered the first
        request."""
        if self._owed_error is not None or self._closing():
            return  # already owed; the parser stays failed, more bytes change nothing
        cycle = self.cycle
        earlier_owed = bool(self.pipeline)
        if self.pipeline and self.pipeline[0][0] is cycle and cycle.more_body:
            self.pipeline.popleft()  # the request whose body was bad: the 400 answers it
        elif cycle is not None and not cycle.more_body and not cycle.response_complete:
            earlier_owed = True  # a complete request still being answered
        if earlier_owed:
            self._owed_error = (status, msg)
            self.flow.pause_reading()
            return
        self._write_error(status, msg)

    def _write_error(self, status: int, msg: str) -> None:
        """uvicorn's `send_400_response` with any status."""
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend([b"content-type: text/plain; charset=utf-8\r\n",
                        b"content-length: " + str(len(msg)).encode("ascii") + b"\r\n",
                        b"connection: close\r\n", b"\r\n", msg.encode("ascii")])
        self.transport.write(b"".join(content))
        self._linger()

    def _linger(self) -> None:
        """A lingering close: FIN after the answer, then whatever the client still sends is
        read and dropped for up to `LINGER` seconds (until it closes its side). Closing at
        once with its bytes unread would reset the connection, and the client (still sending
        a huge head or body, say) would lose the answer."""
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._lingering = True
            self._unset_keepalive_if_required()
            self.flow.resume_reading()  # (what comes is dropped: nothing to hold back)
            self.loop.call_later(LINGER, self.transport.close)
        else:
            self.transport.close()

    def _close_after_answer(self) -> None:
        """The close that follows an answer with ``Connection: close`` (uvicorn's, and
        `respond`'s): at once, or lingering (`_linger`) when the request's body is still
        arriving, answered before it was read (a 413 by its Content-Length, a 404, a 415).
        The client that sent a body of 4 MiB to ``/add-checkpoint`` lost its 413 to the reset
        28 times in 40 before; `make fuzz` met it once in 10,000 requests."""
        if self._in_body and not self._closing():
            self._linger()
        else:
            self.transport.close()

    def on_response_complete(self) -> None:
        self._headers_deadline = None
        last = not self.pipeline  # no pipelined request starts now: every answer is sent
        super().on_response_complete()
        if self._owed_error is not None and not self._closing():
            if last:
                (status, msg), self._owed_error = self._owed_error, None
                self._unset_keepalive_if_required()
                self._write_error(status, msg)
            else:
                self.flow.pause_reading()
            return
        if not self._closing() and self.cycle.response_complete \
                and not self.pipeline:
            self._limit.waiting(self, answered=True)  # idle until the next request

    def _closing(self) -> bool:
        return self._lingering or self.transport.is_closing()

    def _waiting_for_headers(self) -> bool:
        if self._closing() or self._in_body:
            return False
        return self.cycle is None or self.cycle.response_complete

    def _arm_headers_timer(self) -> None:
        now = self.loop.time()
        if self._headers_deadline is None:
            self._headers_deadline = now + self.timeout_keep_alive
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(
            max(0.0, self._headers_deadline - now), self.timeout_keep_alive_handler
        )


class _AnswerTransport:
    """A request's view of its connection (``cycle.transport``): the connection's own, but
    its ``close`` after the answer lingers while the request's body still arrives
    (`StampdHttpProtocol._close_after_answer`). Weak: the protocol holds the cycle."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: StampdHttpProtocol) -> None:
        self._protocol = weakref.proxy(protocol)

    def write(self, data: bytes) -> None:
        self._protocol.transport.write(data)

    def is_closing(self) -> bool:
        return bool(self._protocol.transport.is_closing())

    def close(self) -> None:
        self._protocol._close_after_answer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._protocol.transport, name)


class _CoalescingTransport:
    """Joins the writes of one event-loop turn into one ``send``: uvicorn writes a response's
    headers and body separately, which costs a system call and a TCP segment each."""

    __slots__ = ("_buffer", "_eof", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buffer: list[bytes] = []
        self._eof = False  # an error answer ended the connection: later writes are dropped

    def write(self, data: bytes) -> None:
        if self._eof:
            return
        if not self._buffer:
            self._loop.call_soon(self._flush)
        self._buffer.append(bytes(data))

    def _flush(self) -> None:
        if self._buffer:
            data = b"".join(self._buffer)
            self._buffer.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()
        self._eof = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _cycle_of(scope: Scope) -> RequestResponseCycle | None:
    ref: weakref.ref[RequestResponseCycle] | None = scope.get(CYCLE)
    return None if ref is None else ref()


def whole_body(scope: Scope, limit: int) -> bytes | None:
    """The request's body when it has arrived whole and is at most ``limit`` bytes, taken as
    ASGI's ``receive`` would take it; None when it must be read through ``receive`` (still
    arriving, ``Expect: 100-continue``, too large, the client gone, or no cycle here)."""
    cycle = _cycle_of(scope)
    if (cycle is None or cycle.more_body or cycle.waiting_for_100_continue
            or cycle.disconnected or cycle.response_complete or len(cycle.body) > limit):
        return None
    body = bytes(cycle.body)
    cycle.body = bytearray()
    cycle.message_event.clear()
    return body


_default_head: tuple[object, bytes] = (None, b"")


def _default_headers(cycle: RequestResponseCycle) -> bytes:
    """uvicorn's default headers (``server``, ``date``) as bytes; uvicorn replaces the list
    when the date changes, so the bytes are kept for the list they were made from."""
    global _default_head
    headers = cycle.default_headers
    if _default_head[0] is not headers:
        _default_head = (headers, b"".join(name + b": " + value + b"\r\n"
                                            for name, value in headers))
    return _default_head[1]


async def respond(scope: Scope, send: Send, status: int,
                  headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """Send a whole answer with a Content-Length: in one write straight to the connection
    when this protocol serves the request and nothing holds it back, else as ASGI messages.
    ``headers`` are the server's own (not checked for CR/LF, as uvicorn would), without
    Content-Length or Connection."""
    cycle = _cycle_of(scope)
    if cycle is None or cycle.response_started or cycle.flow.write_paused \
            or scope["method"] == "HEAD":
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return
    if cycle.disconnected:
        return  # (as uvicorn's send)
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    parts = [STATUS_LINE[status], _default_headers(cycle)]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts += (b"content-length: ", str(len(body)).encode(), b"\r\n")
    if not cycle.keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", body)
    cycle.transport.write(b"".join(parts))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
