"""An HTTP process's side of the coordinator (`server.coordinator`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats.jobs import GitJob, Job, ManifestJob, job_message
from formats.keys import PRIMARY
from formats.manifests import Text, utf8_pieces, utf8_size
from server.budgets import once
from server.coordinator.wire import LONG_FRAME, Call, Coalesced, Reply, read_frame
from server.dispatch import Signed, Worker
from server.errors import JournalError, QueueFull, SigningFailed, StampError, Unavailable
from server.stamping.journal import IndexRows, stamp_row
from server.stamping.requests import Request
from server.stamping.stamper import FAILURE_WRITE_TIMEOUT
from server.stats import Stats

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0  # seconds an HTTP process waits for the host at its start
# Why the host's dispatcher did not sign a job (`Reply.unsigned`), as the error it was.
_UNSIGNED: dict[str, type[StampError]] = {"queue": QueueFull, "signing": SigningFailed}


def _signed(answer: Reply) -> Signed:
    """The job signed, as the host answered a ``sign`` or ``stamp`` call; else the error it
    says (`_UNSIGNED`)."""
    if answer.signed is not None:
        return Signed(*answer.signed)
    kind, message = answer.unsigned or ("unavailable", "no answer")
    raise _UNSIGNED.get(kind, Unavailable)(message)


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
    _out: Coalesced | None = None
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
    # The workers connected to the host's dispatcher, by name, as it last told, and its
    # figures as its last answer to `view` gave them (socket dispatch).
    workers: dict[str, Worker] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)

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
        self._out = Coalesced(writer)
        self._reader_task = asyncio.create_task(self._read(reader, writer), name="journal-link")
        return writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = "the coordinator closed the connection"
        try:
            while (frame := await read_frame(reader)) is not None:
                reply = Reply.decode(frame[0])
                if reply.published is not None:
                    if self.on_published is not None:
                        self.on_published(reply.published)
                    continue
                if reply.workers is not None:
                    self.workers = {name: Worker(name, key, pid)
                                    for name, key, pid in reply.workers}
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
        out = self._out
        assert out is not None
        short: bytes | None = None  # (a job's message: one frame like any other)
        if text is not None and len(text) == 1 and isinstance(text[0], bytes) \
                and len(text[0]) <= LONG_FRAME:
            short = text[0]
        call = Call(op, call_id, fields, buckets, short)
        try:
            if buckets or (text and short is None):
                # A frame cut short would break the link: one whose caller gives up is sent
                # to its end all the same.
                sending = asyncio.ensure_future(self._send_long(call, text or (), writer, out))
                sending.add_done_callback(_retrieved)
                try:
                    await asyncio.shield(sending)
                except (OSError, RuntimeError) as e:  # (the link broke: `_read` fails the rest)
                    self._calls.pop(call_id, None)
                    raise JournalError(f"journal unavailable: {e}") from None
            else:
                out.put(call.encode())
            if fut is None:
                return None
            answer = await fut
        except asyncio.CancelledError:
            if self._calls.pop(call_id, None) is not None and op in ("sign", "stamp"):
                self._tell("drop", {"c": call_id})  # (the host forgets its job)
            raise
        if answer.error is not None:
            raise JournalError(answer.error)
        answer.raise_refusal()
        return answer

    async def _send_long(self, call: Call, text: tuple[Text, ...],
                         writer: asyncio.StreamWriter, out: Coalesced) -> None:
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
                    # A turn of the loop per piece, whether drain() waited or not: a
                    # manifest's 127 MiB of lines went out in turns of up to 67 ms (the
                    # dispatcher's writes to a worker do the same: `server.dispatch.socket`).
                    await asyncio.sleep(0)
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
        ``/readyz`` (`server.runtime.siblings`)."""
        self._tell("report", {"r": record})

    async def view(self) -> list[dict[str, Any]]:
        """Every HTTP process's last report (``record``) and its ``age`` in seconds (and the
        host dispatcher's figures, in `host`)."""
        answer = await self._call("view", {})
        assert answer is not None
        self.host = answer.host or {}
        return answer.view or []

    async def sign(self, job: Job, key: str, *, internal: bool = False) -> Signed:
        """Have the host's dispatcher get ``job`` signed by a worker holding ``key``
        (`HostDispatcher`; ``internal``: `Dispatcher.sign`)."""
        message = job_message(job)
        lines = (job.lines,) if isinstance(job, ManifestJob) else ()
        fields: dict[str, Any] = {"k": key, "m": len(message)}
        if internal:
            fields["i"] = True
        try:
            answer = await self._call("sign", fields, text=(message, *lines))
        except JournalError as e:  # (the link is down: this process is about to end)
            raise Unavailable(e.message) from None
        assert answer is not None
        return _signed(answer)

    async def record_and_sign(self, req: Request, t: int, key_id: str | None, job: GitJob,
                              key: str, timeout: float) -> tuple[int, Signed]:
        """`server.stamping.stamper.RecordAndSign`, one ``stamp`` call: the host commits the
        row, has the job signed by a worker of ``key`` within ``timeout`` seconds of the
        commit, or commits its failure, and answers once; a signed one it journals signed
        (with the signed object's id) itself. A host that has not answered when that failure
        had its time to commit too is given up on (`Unavailable`; the row may have been
        committed, and is then left pending, as if this process had died)."""
        started = time.perf_counter()
        message = job_message(job)
        fields = {"row": stamp_row(req, t, key_id), "k": key, "m": len(message), "w": timeout,
                  "g": [job.object_type, job.object_format]}
        try:
            async with asyncio.timeout(timeout + FAILURE_WRITE_TIMEOUT + 1):
                answer = await self._call("stamp", fields, text=(message,))
        except TimeoutError:
            raise Unavailable("no worker could sign in time; retry later") from None
        assert answer is not None
        if answer.stamp_id is None:
            raise JournalError("journal unavailable: no stamp id")
        took = answer.took or 0.0
        self.stats.journal_commit.observe(took)
        signed = _signed(answer)
        self.stats.signing[signed.worker].observe(time.perf_counter() - started - took)
        return answer.stamp_id, signed

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


def _retrieved(task: asyncio.Future[None]) -> None:
    """(a long frame's send whose caller gave up: its failure, if any, is the link's)"""
    if not task.cancelled():
        task.exception()


class HostDispatcher:
    """The `Dispatcher` of an HTTP process when the host's coordinator runs the host's one
    (socket dispatch, several HTTP processes): each job goes over ``link``, one call, and its
    answer comes back on it. The queue, its retries and the workers are the coordinator's;
    its figures reach `/metrics` through `CoordinatorLink.host`."""

    requeued = 0  # (the host's: `CoordinatorLink.host`)

    def __init__(self, link: CoordinatorLink) -> None:
        self.link = link

    async def start(self) -> None:
        pass  # (the link is connected: `server.api.app`)

    async def stop(self) -> None:
        pass

    async def sign(self, job: Job, key: str = PRIMARY, *, internal: bool = False) -> Signed:
        started = time.perf_counter()
        signed = await self.link.sign(job, key, internal=internal)
        self.link.stats.signing[signed.worker].observe(time.perf_counter() - started)
        return signed

    @property
    def workers(self) -> dict[str, Worker]:
        return self.link.workers

    @property
    def queue_depth(self) -> int:
        return 0  # (the host's: `CoordinatorLink.host`)

    def keys_served(self) -> set[str]:
        return {w.key for w in self.link.workers.values()}
