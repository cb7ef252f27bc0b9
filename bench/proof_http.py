"""What the proof programs (`bench.crash`, `bench.slow`, `bench.readflood`) share on the client
side: a small HTTP/1.1 keep-alive client over asyncio streams (no parsing beyond status line,
headers and a Content-Length body: cheap enough that a 2-core machine spends its time in the
server), the stamp requests with an identity of their own, latency summaries, the server
process's open file descriptors, and this process's RLIMIT_NOFILE.
"""

from __future__ import annotations

import asyncio
import math
import os
import resource
import secrets
import time
import urllib.parse
from dataclasses import dataclass, field

FORM = "application/x-www-form-urlencoded"


class HttpError(Exception):
    """No well-formed answer: the connection failed, closed, timed out or sent garbage.
    ``sent``: whether the request went out (False: the connection could not be opened)."""

    def __init__(self, message: str, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


class Conn:
    """One keep-alive connection to 127.0.0.1:port, opened on first use and again after the
    server closed it. `request` raises `HttpError` when no answer came."""

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.port = port
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self.close()
            try:
                self._reader, self._writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), self.timeout)
            except (OSError, TimeoutError) as e:
                raise HttpError(f"connect: {type(e).__name__}: {e}", sent=False) from None
        return self._reader, self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def request(self, method: str, target: str, body: bytes | None = None,
                      ctype: str = FORM, accept: str | None = None) -> Answer:
        reader, writer = await self._open()
        head = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
        if accept:
            head.append(f"Accept: {accept}")
        if body is not None:
            head += [f"Content-Type: {ctype}", f"Content-Length: {len(body)}"]
        data = ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (body or b"")
        try:
            writer.write(data)
            async with asyncio.timeout(self.timeout):
                answer = await _read_answer(reader)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
            self.close()
            raise HttpError(f"{type(e).__name__}: {e}") from None
        if answer.headers.get("connection", "").lower() == "close":
            self.close()
        return answer


async def _read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return Answer(status, headers, body)


# -- stamp requests, each with an identity no other request of the run has ---------------------
@dataclass(frozen=True)
class StampRequest:
    kind: str  # "tag" (Zeitgitter stamp-tag-v1 on POST /) or "digest" (POST /v1/stamps sha256)
    identity: str  # the commit id or the sha256 digest: what the log must show

    @classmethod
    def new(cls, kind: str) -> StampRequest:
        return cls(kind, secrets.token_hex(20 if kind == "tag" else 32))

    @property
    def target(self) -> str:
        return "/" if self.kind == "tag" else "/v1/stamps"

    @property
    def body(self) -> bytes:
        if self.kind == "tag":
            fields = {"request": "stamp-tag-v1", "commit": self.identity, "tagname": "proof"}
        else:
            fields = {"sha256": self.identity}
        return urllib.parse.urlencode(fields).encode("ascii")

    def answered_right(self, answer: Answer) -> bool:
        """A 200 that is the stamp asked for: a tag of this commit, a receipt of this digest."""
        if self.kind == "tag":
            return answer.body.startswith(f"object {self.identity}\n".encode())
        return f"\ndigest: {self.identity}\n".encode() in answer.body

    async def send(self, conn: Conn) -> Answer:
        return await conn.request("POST", self.target, self.body)


# -- latencies ---------------------------------------------------------------------------------
@dataclass
class Latencies:
    seconds: list[float] = field(default_factory=list)

    def add(self, s: float) -> None:
        self.seconds.append(s)

    def pct(self, p: float) -> float:
        """The p-th percentile (nearest rank), milliseconds; 0 when empty."""
        if not self.seconds:
            return 0.0
        s = sorted(self.seconds)
        k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
        return s[k] * 1000

    @property
    def max_ms(self) -> float:
        return max(self.seconds, default=0.0) * 1000

    def summary(self) -> str:
        return (f"n={len(self.seconds)} p50={self.pct(50):.1f} ms p99={self.pct(99):.1f} ms "
                f"max={self.max_ms:.1f} ms")


async def stamp_sequentially(port: int, stop: asyncio.Event, lat: Latencies,
                             kinds: tuple[str, ...] = ("tag", "digest"),
                             failures: list[str] | None = None) -> None:
    """The normal client: one stamp at a time on one keep-alive connection, the kinds in turn,
    until ``stop``; the latency of every answered stamp (client side, send to last byte)."""
    conn = Conn(port, timeout=30)
    i = 0
    try:
        while not stop.is_set():
            req = StampRequest.new(kinds[i % len(kinds)])
            i += 1
            t0 = time.perf_counter()
            try:
                answer = await req.send(conn)
            except HttpError as e:
                if failures is not None:
                    failures.append(f"{req.kind}: {e}")
                await asyncio.sleep(0.05)
                continue
            lat.add(time.perf_counter() - t0)
            if failures is not None and (answer.status != 200 or not req.answered_right(answer)):
                failures.append(f"{req.kind}: {answer.status} {answer.body[:100]!r}")
    finally:
        conn.close()


# -- processes and limits ----------------------------------------------------------------------
def open_fds(pid: int) -> int:
    """Open file descriptors of a process (-1 once it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def raise_nofile(want: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE to ``want`` (at most the hard limit); the new
    soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def children(pid: int) -> list[int]:
    """Direct children of a process (``ps --ppid``), from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2:].split()
        if int(fields[1]) == pid:
            out.append(int(name))
    return sorted(out)


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
