"""The host's coordinator: ``stampd serve``, when it runs several HTTP processes, owns what they
share, and each of them asks it over one Unix socket connection (`CoordinatorLink`):

- **the journal** (SQLite): one writer for every HTTP process of the host. Each HTTP process
  committing its own groups made the processes take turns at SQLite's one write lock, one
  fsync each: with four processes on 12 cores, 43% of the time spent inside a request went to
  waiting for the others' commits (bench/RESULTS.md, "Many cores"). Here the rows of every
  process that arrive while one commit runs go into the next, one fsync for all. (On
  PostgreSQL each process commits its own groups; the database takes them together.)
- **the budgets** (`server.budgets.HostBudgets`): the hourly manifest bytes, the manifest bytes
  in flight, the witness's requests a minute. A process's bytes in flight are given back when
  its connection closes.
- **the processes' view**: each HTTP process reports its counters and its view of the workers
  four times a second; ``GET /metrics`` and ``GET /readyz``, in whichever process answers,
  add up or check every process's last report (`server.api.siblings`);
- **the news** of each transparency log checkpoint published on the host: the HTTP process
  that writes the tiles tells it, and it tells every HTTP process (their proof waiters, which
  cost nothing until then, look again: `server.tlog.waiters`).

The coordinator runs in a thread of its own of the ``stampd serve`` process, which serves no
request itself (`Coordinator`). Nothing changes in what is promised: a request is answered (and
signed) only after the host has committed its row and replied with its id. An HTTP process
killed loses only its connection: the rows it sent are committed, or were never acknowledged.
The coordinator dies only with ``stampd serve``, whose HTTP processes die with it; if its thread
fails, it stops the server (SIGTERM to its own process) rather than leave the HTTP processes
answering 503.

The wire (`Call`, `Reply`): frames of a 4-byte big-endian length, then a 4-byte length of a
JSON object, the object, and the bytes it names (a manifest's digest buckets, or its signed
text in UTF-8).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from sqlalchemy import Engine

from formats.manifests import Text, utf8_pieces, utf8_size
from server.budgets import HostBudgets, ManifestsBusy, RateLimited, once
from server.errors import CommandFailed, JournalError
from server.stamping.journal import IndexRows, Journal, stamp_row
from server.stamping.requests import Request
from server.stats import Stats
from workers import memory

log = logging.getLogger(__name__)

LENGTH = struct.Struct(">I")
MAX_CALL = 1 << 30  # a manifest of 10^6 sha512 digests packs into ~64 MB; far below this
LONG_FRAME = 1 << 20  # a frame longer than this is read into a buffer of its own (`_read_frame`)
CONNECT_TIMEOUT = 30.0  # seconds an HTTP process waits for the host at its start


# -- the wire -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """What an HTTP process asks of the coordinator: of the journal, ``record`` a stamp row
    (and a manifest's digest buckets), or an outcome, ``signed`` or ``failed``, or
    ``manifest``: a signed manifest's ``text`` (UTF-8) stored with its outcome; of the
    budgets, ``charge`` a client (``b``: the budget, ``c``: the client's key in hex, ``n``),
    ``take`` or ``give`` back ``n`` manifest bytes in flight; of the news, that a checkpoint
    of size ``n`` was ``published`` (told to every HTTP process); ``hello``, answered once
    the connection is one the news go to (its first call); of the processes' view, ``report``
    this process's counters (``r``, `server.api.siblings.Siblings.record`), and ``view``
    every process's last report. ``call_id`` 0: no reply
    wanted (an outcome that rides along with the next commit, `Journal.signed`; bytes given
    back; news)."""

    op: str
    call_id: int
    fields: dict[str, Any]
    buckets: IndexRows | None = None
    text: bytes | memoryview | None = None

    OPS = ("hello", "record", "signed", "failed", "manifest", "charge", "take", "give",
           "published", "report", "view")

    def head(self, tail: int = 0) -> bytes:
        """The frame up to its tail, whose length is ``tail`` (a text sent after it)."""
        head: dict[str, Any] = {"op": self.op, "id": self.call_id, "f": self.fields}
        if self.buckets is not None:
            # Two flat lists: a list of [key, size] pairs took 65 ms to encode and 50 to
            # decode for a manifest's 65,536 rows, each time holding a process's event loop.
            sizes = [len(packed) for _, packed in self.buckets]
            head["bk"] = [key for key, _ in self.buckets]
            head["bn"] = sizes
            tail += sum(sizes)
        text = json.dumps(head, separators=(",", ":")).encode()
        return LENGTH.pack(LENGTH.size + len(text) + tail) + LENGTH.pack(len(text)) + text

    def encode(self) -> bytes:
        text = bytes(self.text or b"")
        tail = b"".join(packed for _, packed in self.buckets or ())
        return self.head(len(text)) + tail + text

    @classmethod
    def decode(cls, body: bytes | bytearray) -> Call:
        """A call from a frame's body (after its length); ValueError if it is not one. A
        text is a view of ``body`` (not a copy of it)."""
        head, tail = _split(body)
        op, call_id, fields = head.get("op"), head.get("id"), head.get("f")
        if op not in cls.OPS or not isinstance(call_id, int) or not isinstance(fields, dict):
            raise ValueError("not a journal call")
        buckets: IndexRows | None = None
        if "bk" in head:
            buckets = FrameBuckets(head["bk"], head.get("bn"), tail)
        return cls(op, call_id, fields, buckets, tail if op == "manifest" else None)


@dataclass(frozen=True)
class Reply:
    """The coordinator's answer to a call with an id: the stamp id of a recorded row (None for
    an outcome or a budget's yes), the error that kept it from being committed, or the budget
    that ``refused`` it: ``rate`` (`RateLimited`) or ``busy`` (`ManifestsBusy`), its message,
    and the seconds after which to retry; or the ``view`` asked for: every HTTP process's last
    report, with its age in seconds. Or, with ``call_id`` 0, news pushed to every HTTP
    process: the size of a checkpoint ``published`` on the host."""

    call_id: int
    stamp_id: int | None = None
    error: str | None = None
    refused: tuple[str, str, int] | None = None
    published: int | None = None
    view: list[dict[str, Any]] | None = None

    REFUSALS = ("rate", "busy")

    def encode(self) -> bytes:
        head: dict[str, Any] = {"id": self.call_id, "sid": self.stamp_id, "error": self.error}
        if self.refused is not None:
            head["no"] = list(self.refused)
        if self.published is not None:
            head["pub"] = self.published
        if self.view is not None:
            head["view"] = self.view
        text = json.dumps(head, separators=(",", ":")).encode()
        body = LENGTH.pack(len(text)) + text
        return LENGTH.pack(len(body)) + body

    @classmethod
    def decode(cls, body: bytes | bytearray) -> Reply:
        head, _ = _split(body)
        call_id, sid, error = head.get("id"), head.get("sid"), head.get("error")
        no, published, view = head.get("no"), head.get("pub"), head.get("view")
        if (not isinstance(call_id, int) or not (sid is None or isinstance(sid, int))
                or not (error is None or isinstance(error, str))
                or not (published is None or isinstance(published, int))
                or not (view is None or (isinstance(view, list)
                                         and all(isinstance(r, dict) for r in view)))):
            raise ValueError("not a coordinator reply")
        refused = None
        if no is not None:
            if not (isinstance(no, list) and len(no) == 3 and no[0] in cls.REFUSALS
                    and isinstance(no[1], str) and isinstance(no[2], int)):
                raise ValueError("not a coordinator reply")
            refused = (no[0], no[1], no[2])
        return cls(call_id, sid, error, refused, published, view)

    def raise_refusal(self) -> None:
        """The refusal as the budget raised it, if this is one."""
        if self.refused is None:
            return
        kind, message, retry = self.refused
        if kind == "rate":
            raise RateLimited(message, retry)
        busy = ManifestsBusy(message)
        busy.retry_after = retry
        raise busy


class FrameBuckets(Sequence[tuple[int, bytes]]):
    """A manifest's index rows as a journal call carried them: their keys, and their packed
    digests one after another in ``data`` (a view of the frame), ``sizes`` bytes each. A row
    is made when it is asked for, as the journal writes it a slice per commit: making all
    65,536 rows of a manifest at once held the host's event loop (and every stamp's reply)
    for 45 ms."""

    def __init__(self, keys: Any, sizes: Any, data: memoryview) -> None:
        # (checked with what runs in C: the rows' keys are checked as each is written)
        try:
            if (not isinstance(keys, list) or not isinstance(sizes, list)
                    or len(keys) != len(sizes) or (sizes and min(sizes) <= 0)):
                raise ValueError("malformed buckets")
            self.ends = array.array("q", itertools.accumulate(sizes))
        except (TypeError, OverflowError):
            raise ValueError("malformed buckets") from None
        if (self.ends[-1] if self.ends else 0) != len(data):
            raise ValueError("the buckets do not add up")
        self.keys: list[int] = keys
        self.data = data

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, i: int) -> tuple[int, bytes]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, bytes]]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, bytes] | list[tuple[int, bytes]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        start = self.ends[i - 1] if i > 0 else 0
        return self.keys[i], bytes(self.data[start:self.ends[i]])


def _split(body: bytes | bytearray) -> tuple[dict[str, Any], memoryview]:
    if len(body) < LENGTH.size:
        raise ValueError("short frame")
    (n,) = LENGTH.unpack(body[:LENGTH.size])
    head = json.loads(body[LENGTH.size:LENGTH.size + n])
    if not isinstance(head, dict):
        raise ValueError("not a JSON object")
    return head, memoryview(body)[LENGTH.size + n:]


async def _read_frame(reader: asyncio.StreamReader) -> bytes | bytearray | None:
    """The next frame's body; None at the end of the stream (ConnectionError inside a frame).
    A long one (a manifest's text, its buckets) is read into one buffer of its size as it
    arrives: ``readexactly`` gathers it in the stream's own buffer and then copies that, and
    the host held three copies of a 105 MiB text at once (+275 MiB; one copy now)."""
    try:
        (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    except asyncio.IncompleteReadError:
        return None
    if size > MAX_CALL:
        raise ValueError(f"a frame of {size} bytes")
    if size <= LONG_FRAME:
        try:
            return await reader.readexactly(size)
        except asyncio.IncompleteReadError:
            raise ConnectionError("the connection closed inside a frame") from None
    body = bytearray(size)
    view, at = memoryview(body), 0
    while at < size:
        chunk = await reader.read(size - at)
        if not chunk:
            raise ConnectionError("the connection closed inside a frame")
        view[at:at + len(chunk)] = chunk
        at += len(chunk)
    return body


# -- the host -----------------------------------------------------------------------------------

class Coordinator:
    """The host's one `Journal` (when ``make_engine`` is given: SQLite) and its `HostBudgets`,
    in a thread with its own event loop, serving the HTTP processes on ``socket_path``
    (0600)."""

    def __init__(self, socket_path: Path, make_engine: Callable[[], Engine] | None,
                 budgets: HostBudgets) -> None:
        self.socket_path = socket_path
        self.make_engine = make_engine
        self.budgets = budgets
        self.journal: Journal | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._links: set[asyncio.Task[None]] = set()  # one task per connected process
        self._outs: set[_Coalesced] = set()  # (what each of them is sent)
        # Each connected process's last report and when it came (monotonic seconds).
        self._reports: dict[int, tuple[dict[str, Any], float]] = {}
        self._thread = threading.Thread(target=self._run, name="coordinator", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        """Start serving; return once the socket listens (raise what kept it from it)."""
        self._thread.start()
        if not self._ready.wait(timeout) or self._failed is not None:
            raise CommandFailed(f"the host's coordinator did not start: {self._failed}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, commit what is queued, close (after the HTTP processes stopped)."""
        if not self._thread.is_alive():
            return
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # (its loop closed meanwhile)
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def _run(self) -> None:
        memory.fix_thresholds()  # (the manifests' texts it takes go back to the system)
        try:
            import uvloop  # the event loop of the HTTP processes too (uvicorn[standard])

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(self._main())
        except BaseException as e:  # the HTTP processes cannot journal: stop the server
            self._failed = e
            if self._ready.is_set():
                log.exception("the host's coordinator failed; stopping the server")
                os.kill(os.getpid(), signal.SIGTERM)
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        engine = None if self.make_engine is None else self.make_engine()
        journal = self.journal = None if engine is None else Journal(engine)
        if journal is not None:
            journal.start()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for link in list(self._links):
                link.cancel()
            if self._links:
                await asyncio.wait(self._links, timeout=10)
            await server.wait_closed()
            if journal is not None:
                await journal.stop()
            if engine is not None:
                engine.dispose()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = asyncio.current_task()
        assert link is not None
        self._links.add(link)
        out = _Coalesced(writer)
        self._outs.add(out)
        waiting: set[asyncio.Future[Any]] = set()
        owner = id(link)  # (what the process holds in the budgets is under this name)
        try:
            while (body := await _read_frame(reader)) is not None:
                call = Call.decode(body)
                # Nothing here holds a frame once it is taken: a manifest's text (a view of
                # its frame) is the journal's until it is written. (The last frame of each
                # connection stayed until the next came: +141 MiB after a 105 MiB manifest.)
                del body
                if call.op == "hello":
                    out.put(Reply(call.call_id).encode())
                elif call.op == "report":
                    record = call.fields.get("r")
                    if not isinstance(record, dict):
                        raise ValueError("a report without its record")
                    self._reports[owner] = (record, time.monotonic())
                elif call.op == "view":
                    now = time.monotonic()
                    out.put(Reply(call.call_id, view=[
                        {"record": r, "age": now - t} for r, t in self._reports.values()
                    ]).encode())
                elif call.op == "published":
                    self._tell_all(call)
                elif call.op in ("charge", "take", "give"):
                    self._budget(call, owner, out)
                else:
                    self._take(call, out, waiting)
                del call
        except (ValueError, ConnectionError) as e:
            log.warning("coordinator: dropping a connection: %s", e)
        except asyncio.CancelledError:
            pass  # (stopping: the rows already sent are in the journal's queue)
        finally:
            self._outs.discard(out)
            self._reports.pop(owner, None)  # (it serves no more)
            self.budgets.in_flight.drop(owner)  # (its process is gone, or going)
            if waiting:  # what was asked is recorded before the connection goes
                await asyncio.wait(waiting, timeout=30)
            out.flush()
            writer.close()
            self._links.discard(link)

    def _tell_all(self, call: Call) -> None:
        """News from one HTTP process (the one writing the host's transparency log tiles) to
        every one of them: each wakes its proof waiters (`server.tlog.waiters`)."""
        size = call.fields.get("n")
        if not isinstance(size, int) or isinstance(size, bool):
            raise ValueError("news without a size")
        news = Reply(0, published=size).encode()
        for out in self._outs:
            out.put(news)

    def _budget(self, call: Call, owner: int, out: _Coalesced) -> None:
        """Count, hold or give back what ``call`` says, and answer at once."""
        f = call.fields
        n = f.get("n")
        if not isinstance(n, int) or isinstance(n, bool):
            raise ValueError("a budget call without its count")
        if call.op == "give":
            self.budgets.in_flight.give(owner, n)
            return
        try:
            if call.op == "take":
                self.budgets.in_flight.take(owner, n)
            else:
                self.budgets.charge(f["b"], bytes.fromhex(f["c"]), n)
        except RateLimited as e:
            out.put(Reply(call.call_id, refused=("rate", e.message, e.retry_after)).encode())
        except ManifestsBusy as e:
            out.put(Reply(call.call_id, refused=("busy", str(e), e.retry_after)).encode())
        except (KeyError, TypeError) as e:
            raise ValueError(f"a malformed budget call: {e}") from None
        else:
            out.put(Reply(call.call_id).encode())

    def _take(self, call: Call, out: _Coalesced, waiting: set[asyncio.Future[Any]]
              ) -> None:
        """Hand ``call`` to the journal; its reply goes out when its commit is done (no task
        per call: at thousands of stamps a second this thread serves every HTTP process)."""
        f, cid = call.fields, call.call_id
        if self.journal is None:  # (PostgreSQL: each HTTP process journals itself)
            if cid:
                out.put(Reply(cid, error="journal unavailable: not kept here").encode())
            return
        fut: asyncio.Future[Any] | None = None
        if call.op == "record":
            fut = self.journal.record_row_nowait(f, call.buckets)
        elif call.op == "manifest":
            fut = self.journal.signed_manifest_durably_nowait(f["sid"], f["worker"],
                                                              f["attempts"], (call.text or b"",))
        elif call.op == "signed":
            if cid:
                fut = self.journal.signed_durably_nowait(f["sid"], f["worker"], f["attempts"],
                                                         f["receipt"])
            else:
                self.journal.signed(f["sid"], f["worker"], f["attempts"], f["object_id"],
                                    f["receipt"])
        elif cid:
            fut = self.journal.failed_durably_nowait(f["sid"], f["error"])
        else:
            self.journal.failed(f["sid"], f["error"])
        if fut is None:
            return
        waiting.add(fut)

        def done(fut: asyncio.Future[Any]) -> None:
            waiting.discard(fut)
            if fut.cancelled():
                out.put(Reply(cid, error="journal unavailable: stopping").encode())
            elif (e := fut.exception()) is not None:
                message = e.message if isinstance(e, JournalError) else "journal unavailable"
                out.put(Reply(cid, error=message).encode())
            else:
                result = fut.result()
                out.put(Reply(cid, result if isinstance(result, int) else None).encode())

        fut.add_done_callback(done)


class _Coalesced:
    """Frames for one stream, written together once per turn of the event loop: one send for
    every reply a commit releases, or every call a process makes meanwhile."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.frames: list[bytes] = []
        self.held = False  # a long frame is being written a piece at a time (`CoordinatorLink`)

    def put(self, frame: bytes) -> None:
        if not self.frames:
            asyncio.get_running_loop().call_soon(self.flush)
        self.frames.append(frame)

    def flush(self) -> None:
        if self.held:
            return  # (written when the long frame ends)
        if self.frames and not self.writer.is_closing():
            self.writer.write(b"".join(self.frames))
        self.frames.clear()


# -- the HTTP process's side ----------------------------------------------------------------------

@dataclass
class CoordinatorLink:
    """An HTTP process's one connection to its host's coordinator (`Coordinator`): the
    interface of `Journal` (where the coordinator keeps the journal: SQLite) and of
    `server.budgets.Budgets`. Every call fails with `JournalError` while the coordinator cannot
    be reached; nothing is retried behind the caller's back (a request not acknowledged was
    not recorded)."""

    socket_path: Path
    stats: Stats = field(default_factory=Stats)
    _writer: asyncio.StreamWriter | None = None
    _out: _Coalesced | None = None
    _reader_task: asyncio.Task[None] | None = None
    _calls: dict[int, asyncio.Future[Reply]] = field(default_factory=dict)
    _next_id: int = 1
    # Long frames (a manifest's buckets or text) are written one at a time, each alone.
    _long: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Called when the host closes the link or it breaks (not when this side stops), before
    # any call in flight fails: such a call's row may have been committed, so failing it
    # would tell a client "not recorded" about a recorded stamp. The host lives as long as
    # ``stampd serve``; an HTTP process ends here (server.api.app), as it would with the server.
    on_host_lost: Callable[[], None] | None = None
    # Called with the size of each checkpoint published on the host (in whichever of its HTTP
    # processes writes the tiles): the process's proof waiters look again.
    on_published: Callable[[int], None] | None = None
    _stopping: bool = False

    def start(self) -> None:
        pass  # (connects on the first call; `connect` waits for the host at start-up)

    async def connect(self, timeout: float = CONNECT_TIMEOUT) -> None:
        """Connect, waiting (bounded) for the host to listen, and say hello: once answered,
        every news of the host reaches this process."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self._connect()
                await self._call("hello", {})
                return
            except JournalError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def _connect(self) -> asyncio.StreamWriter:
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
        except OSError as e:
            raise JournalError(f"journal unavailable: {e.strerror or e}") from None
        self._writer = writer
        self._out = _Coalesced(writer)
        self._reader_task = asyncio.create_task(self._read(reader, writer), name="journal-link")
        return writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = "the journal host closed the connection"
        try:
            while (body := await _read_frame(reader)) is not None:
                reply = Reply.decode(body)
                if reply.published is not None:
                    if self.on_published is not None:
                        self.on_published(reply.published)
                    continue
                fut = self._calls.pop(reply.call_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except (ValueError, ConnectionError) as e:
            why = f"journal link broken: {e}"
        finally:
            lost = self._writer is writer and not self._stopping
            if self._writer is writer:
                self._writer = None
            writer.close()
            if lost and self.on_host_lost is not None:
                self.on_host_lost()
            for fut in self._calls.values():
                if not fut.done():
                    fut.set_exception(JournalError(f"journal unavailable: {why}"))
            self._calls.clear()

    async def _call(self, op: str, fields: dict[str, Any], buckets: IndexRows | None = None,
                    reply: bool = True, text: tuple[Text, ...] | None = None
                    ) -> Reply | None:
        writer = await self._connect()
        call_id = 0
        fut: asyncio.Future[Reply] | None = None
        if reply:
            call_id, self._next_id = self._next_id, self._next_id + 1
            fut = self._calls[call_id] = asyncio.get_running_loop().create_future()
        call = Call(op, call_id, fields, buckets)
        out = self._out
        assert out is not None
        if buckets or text:
            try:
                await self._send_long(call, text or (), writer, out)
            except BaseException as e:
                self._calls.pop(call_id, None)
                if isinstance(e, OSError | RuntimeError):  # (the link broke: `_read` fails
                    raise JournalError(f"journal unavailable: {e}") from None  # the rest)
                raise
        else:
            out.put(call.encode())
        if fut is None:
            return None
        answer = await fut
        if answer.error is not None:
            raise JournalError(answer.error)
        answer.raise_refusal()
        return answer

    async def _send_long(self, call: Call, text: tuple[Text, ...],
                         writer: asyncio.StreamWriter, out: _Coalesced) -> None:
        """A manifest's buckets (megabytes) or signed text (up to 256 MiB), straight to the
        socket: the text a piece at a time in UTF-8 (no copy of it in bytes), waiting for the
        host to take each. The short frames put meanwhile wait until the frame ends."""
        size = utf8_size(*text)
        async with self._long:
            out.flush()
            out.held = True
            try:
                writer.write(call.head(size))
                # The rows a MiB at a time, each joined (one write each of 65,536 rows held
                # the event loop for as many send calls).
                batch: list[bytes] = []
                filled = 0
                for _, packed in call.buckets or ():
                    batch.append(packed)
                    filled += len(packed)
                    if filled >= LONG_FRAME:
                        writer.write(b"".join(batch))
                        batch, filled = [], 0
                        await writer.drain()
                        await asyncio.sleep(0)
                writer.write(b"".join(batch))
                for piece in utf8_pieces(*text):
                    writer.write(piece)
                    await writer.drain()
                await writer.drain()
            finally:
                out.held = False
                out.flush()

    async def record(self, req: Request, t: int, key_id: str | None = None) -> int:
        """Commit the request durably (in the host's journal); its stamp id."""
        started = time.perf_counter()
        answer = await self._call("record", stamp_row(req, t, key_id), req.digest_buckets())
        assert answer is not None
        if answer.stamp_id is None:
            raise JournalError("journal unavailable: no stamp id")
        self.stats.journal_commit.observe(time.perf_counter() - started)
        return answer.stamp_id

    def signed(self, stamp_id: int, worker: str | None, attempts: int, object_id: str | None,
               receipt: str | None = None) -> None:
        """The outcome, with the host's next group commit (not awaited: bookkeeping)."""
        self._outcome("signed", {"sid": stamp_id, "worker": worker, "attempts": attempts,
                                 "object_id": object_id, "receipt": receipt})

    async def signed_durably(self, stamp_id: int, worker: str | None, attempts: int,
                             receipt: str) -> None:
        await self._call("signed", {"sid": stamp_id, "worker": worker, "attempts": attempts,
                                    "object_id": None, "receipt": receipt})

    async def signed_manifest_durably(self, stamp_id: int, worker: str | None, attempts: int,
                                      parts: tuple[Text, ...]) -> None:
        await self._call("manifest", {"sid": stamp_id, "worker": worker, "attempts": attempts},
                         text=parts)

    def failed(self, stamp_id: int, error: str) -> None:
        self._outcome("failed", {"sid": stamp_id, "error": error})

    async def failed_durably(self, stamp_id: int, error: str) -> None:
        await self._call("failed", {"sid": stamp_id, "error": error})

    def _outcome(self, op: str, fields: dict[str, Any]) -> None:
        if not self._tell(op, fields):
            # (the host is gone, and with it `stampd serve`: this process is about to die)
            log.warning("coordinator unreachable: the %s outcome of stamp %s is not recorded",
                        op, fields["sid"])

    def _tell(self, op: str, fields: dict[str, Any]) -> bool:
        """Send a call that wants no reply; False when the link is down."""
        if self._writer is None or self._writer.is_closing():
            return False
        assert self._out is not None
        self._out.put(Call(op, 0, fields).encode())
        return True

    def report(self, record: dict[str, Any]) -> None:
        """This process's counters and view of the workers, for the others' ``/metrics`` and
        ``/readyz`` (`server.api.siblings`)."""
        self._tell("report", {"r": record})

    async def view(self) -> list[dict[str, Any]]:
        """Every HTTP process's last report (``record``) and its ``age`` in seconds."""
        answer = await self._call("view", {})
        assert answer is not None
        return answer.view or []

    def published(self, size: int) -> None:
        """Tell every HTTP process of the host (this one too) that a checkpoint of ``size``
        was published."""
        self._tell("published", {"n": size})

    async def charge(self, budget: str, client: bytes, n: int) -> None:
        """`server.budgets.Budgets.charge`, counted by the coordinator."""
        await self._call("charge", {"b": budget, "c": client.hex(), "n": n})

    async def take(self, n: int) -> Callable[[], None]:
        """`server.budgets.Budgets.take`, held by the coordinator (until given back, or this
        connection closes)."""
        await self._call("take", {"n": n})

        def give() -> None:
            self._tell("give", {"n": n})  # (a link that is down gave them back already)

        return once(give)

    async def stop(self) -> None:
        self._stopping = True
        if self._out is not None:
            self._out.flush()  # (outcomes put this turn go before the close)
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._reader_task is not None:
            with contextlib.suppress(BaseException):
                await self._reader_task
