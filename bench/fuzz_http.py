"""Raw HTTP/1.1 exchanges for the fuzzer: a `Case` is the exact bytes of one or more requests
(pipelined, split into pieces, half-closed), sent over a plain asyncio connection; each request
gets one `Outcome`: the status of its answer, or that the server closed the connection without
answering it, or that nothing came within the bound (a hang), or that what came is not an HTTP
response. Nothing here knows stampd: the generators (`bench.fuzz_cases`, `bench.fuzz_schema`)
build cases, `bench.fuzz` judges the outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field

ANSWERED = "answered"
CLOSED = "closed"  # connection closed (or reset) before the answer began
HANG = "hang"  # neither an answer nor a close within the bound
GARBLED = "garbled"  # bytes that are not a well-formed HTTP/1.x response
NOT_SENT = "not-sent"  # no connection could be made
SKIPPED = "skipped"  # a later request of a pipeline, after the connection ended

EXPECT_OK = "ok"  # a conforming server must accept it (200)
EXPECT_REJECT = "reject"  # a conforming server must refuse it (4xx)

STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})(?: [^\r\n]*)?\r\n")
PARSER_400 = b"Invalid HTTP request received."  # uvicorn's own answer to unparsable bytes


@dataclass
class Req:
    """One request inside a case, in the order it appears on the wire."""

    method: str  # HEAD answers carry no body
    target: str  # for the report
    markers: tuple[str, ...] = ()  # unique values only this request carries
    expect: str | None = None  # EXPECT_OK / EXPECT_REJECT when the rules decide it
    well_formed: bool = True  # valid HTTP framing: the server must answer, not just close


@dataclass
class Case:
    generator: str
    label: str  # the mutation, short, for the report
    wire: list[bytes]  # written in this order, `pause` seconds apart
    reqs: list[Req]
    pause: float = 0.0
    half_close: bool = False  # shut our sending side after the last piece
    may_close: str | None = None  # why closing without an answer is allowed (malformed HTTP)
    trailing_junk: bool = False  # bytes that are no request follow the last request

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.wire)


@dataclass
class Outcome:
    kind: str
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    seconds: float = 0.0
    detail: str = ""

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    @property
    def parser_400(self) -> bool:
        """uvicorn's answer to bytes it could not parse (sent at once, whatever is in flight)."""
        return self.status == 400 and self.body == PARSER_400


class _Garbled(Exception):
    pass


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[bytes, bytes]],
                     timeout: float) -> bytes:
    te = b",".join(v for k, v in headers if k.lower() == b"transfer-encoding").lower()
    lengths = [v for k, v in headers if k.lower() == b"content-length"]
    if b"chunked" in te:
        out = bytearray()
        while True:
            line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
            size_text = line.split(b";", 1)[0].strip()
            if not re.fullmatch(rb"[0-9a-fA-F]{1,16}", size_text):
                raise _Garbled(f"bad chunk size {line[:40]!r}")
            size = int(size_text, 16)
            if size == 0:
                while (await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)) != b"\r\n":
                    pass  # trailers
                return bytes(out)
            out += await asyncio.wait_for(reader.readexactly(size + 2), timeout)
            del out[-2:]
    if lengths:
        if len(set(lengths)) != 1 or not lengths[0].strip().isdigit():
            raise _Garbled(f"content-length {lengths!r}")
        return await asyncio.wait_for(reader.readexactly(int(lengths[0])), timeout)
    return await asyncio.wait_for(reader.read(), timeout)  # until the server closes


async def read_response(reader: asyncio.StreamReader, method: str, bound: float) -> Outcome:
    """The next response on the connection (1xx interim answers skipped)."""
    t0 = time.monotonic()
    deadline = t0 + bound
    while True:
        left = max(0.01, deadline - time.monotonic())
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), left)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                return Outcome(GARBLED, seconds=time.monotonic() - t0,
                               detail=f"closed inside the head: {e.partial[:80]!r}")
            return Outcome(CLOSED, seconds=time.monotonic() - t0)
        except asyncio.LimitOverrunError:
            return Outcome(GARBLED, seconds=time.monotonic() - t0, detail="head too long")
        except TimeoutError:
            return Outcome(HANG, seconds=time.monotonic() - t0)
        except ConnectionError as e:
            return Outcome(CLOSED, seconds=time.monotonic() - t0, detail=type(e).__name__)
        m = STATUS_LINE.match(head)
        if m is None:
            return Outcome(GARBLED, seconds=time.monotonic() - t0,
                           detail=f"status line {head[:80]!r}")
        status = int(m.group(1))
        headers: list[tuple[bytes, bytes]] = []
        block = head[m.end():-4]
        for line in block.split(b"\r\n") if block else []:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                return Outcome(GARBLED, status, seconds=time.monotonic() - t0,
                               detail=f"header line {line[:80]!r}")
            headers.append((name, value.strip()))
        if 100 <= status < 200 and status != 101:
            continue  # 100 Continue and friends: the answer follows
        try:
            if method == "HEAD" or status in (101, 204, 304):
                body = b""
            else:
                body = await _read_body(reader, headers, max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            return Outcome(HANG, status, headers, seconds=time.monotonic() - t0,
                           detail="body did not arrive")
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            return Outcome(GARBLED, status, headers, seconds=time.monotonic() - t0,
                           detail=f"closed inside the body ({type(e).__name__})")
        except (_Garbled, asyncio.LimitOverrunError) as e:
            return Outcome(GARBLED, status, headers, seconds=time.monotonic() - t0,
                           detail=str(e))
        return Outcome(ANSWERED, status, headers, body, time.monotonic() - t0)


async def exchange(host: str, port: int, case: Case, bound: float) -> list[Outcome]:
    """Send `case` on a fresh connection and read one outcome per request in it. An answer
    that closes the connection, or a request without an answer, ends the exchange: the later
    requests of the case are `SKIPPED`."""
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=1 << 22), bound)
    except (OSError, TimeoutError) as e:
        return [Outcome(NOT_SENT, detail=f"{type(e).__name__}: {e}")] * len(case.reqs)
    outcomes: list[Outcome] = []
    try:
        for i, piece in enumerate(case.wire):
            if i and case.pause:
                await asyncio.sleep(case.pause)
            try:
                writer.write(piece)
                await asyncio.wait_for(writer.drain(), bound)
            except (ConnectionError, TimeoutError):
                break  # the server stopped reading: what did it answer?
        if case.half_close and not writer.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()
        for req in case.reqs:
            out = await read_response(reader, req.method, bound)
            if not outcomes:
                out.seconds = time.monotonic() - t0
            outcomes.append(out)
            if out.kind != ANSWERED:
                break
            if (out.header(b"connection") or b"").lower() == b"close":
                break
        while len(outcomes) < len(case.reqs):
            last = outcomes[-1]
            why = ("the answer to an earlier request closed the connection"
                   if last.kind == ANSWERED else f"an earlier request: {last.kind}")
            outcomes.append(Outcome(SKIPPED, detail=why))
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 2)
    return outcomes
