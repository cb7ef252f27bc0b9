"""The journal: every accepted request is committed to the database before it is signed.

Writes are grouped: requests that arrive while one transaction is being committed all go into
the next one, so one durable commit (one fsync on SQLite) covers a whole group and the journal
never becomes the per-request bottleneck. Completion updates (worker, object id) ride along in
the same transactions; they are bookkeeping, not a precondition of the answer.

What is too big for one group is written a slice per group (`_Bulk`, at most `BULK_BYTES` a
commit): a manifest's digest index rows, after its stamp row and before its id is handed back
(so before it is signed), and its signed text's pieces, before its outcome, which goes into the
transaction of the last piece. A stamp arriving meanwhile waits for one slice's commit, not for
a manifest's 256 MiB (its p99 was 673 ms while 127 MiB manifests were stored), and its own
commit takes no slice unless the one before took none (`Journal._write_once`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Engine

from formats.manifests import Text, key_prefix
from server.db import Writes
from server.errors import JournalError
from server.models import StampState
from server.stamping.journal_writers import IndexRow, Piece, SqlAlchemyWriter, SqliteWriter
from server.stamping.requests import Request
from server.stats import Stats

log = logging.getLogger(__name__)

UPDATE_DELAY = 0.5  # seconds an outcome may wait for the next group commit


# A signed text in parts, whose concatenation it is (text, or UTF-8 bytes).
TextParts = Sequence[str | bytes | bytearray | memoryview]

BULK_BYTES = 1 << 20  # bytes of bulk rows one group commit takes at most (at least one row)
PIECE = 1 << 20  # characters (or bytes) of a signed text stored as one piece
# A manifest's index rows, (`formats.manifests.bucket_key`, packed digests): a list
# (`formats.manifests.Buckets`), or rows made one at a time as they are written
# (`server.coordinator.FrameBuckets`).
IndexRows = Sequence[tuple[int, bytes]]


@dataclass
class _Pending:
    row: dict[str, Any]
    future: asyncio.Future[int]
    buckets: IndexRows | None = None  # manifests: written after the row, a slice per commit


@dataclass(eq=False)
class _Bulk(abc.ABC):
    """Rows of one stamp written a slice per group commit; ``done`` of them are committed (set
    on the event loop after the commit, read by the journal thread for the next slice)."""

    sid: int
    future: asyncio.Future[Any]
    done: int = 0

    @property
    @abc.abstractmethod
    def total(self) -> int:
        """How many rows there are in all."""

    @abc.abstractmethod
    def finish(self) -> None:
        """All committed: the waiter is told."""


@dataclass(eq=False)
class _IndexRows(_Bulk):
    """A manifest's digest index rows; its ``future`` gets the stamp id once all are in."""

    algorithm: str = ""
    rows: IndexRows = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.rows)

    def take(self, budget: int) -> tuple[list[IndexRow], int, int]:
        """The next rows within ``budget`` bytes (one at least); the count after them, and
        their bytes."""
        out: list[IndexRow] = []
        size, i = 0, self.done
        while i < len(self.rows):
            key, packed = self.rows[i]  # (once: a `FrameBuckets` row is made when asked for)
            if out and size + len(packed) > budget:
                break
            out.append((self.sid, key_prefix(key), self.algorithm, packed))
            size += len(packed)
            i += 1
        return out, i, size

    def finish(self) -> None:
        if not self.future.done():
            self.future.set_result(self.sid)


@dataclass(eq=False)
class _TextPieces(_Bulk):
    """A signed manifest's text, stored in pieces (`server.models.ManifestText`); its
    outcome (``update``) is written with the last piece, and its ``future`` told then."""

    parts: TextParts = ()
    update: dict[str, Any] = field(default_factory=dict)
    spans: list[tuple[int, int]] = field(default_factory=list)  # (part, start) of each piece

    def __post_init__(self) -> None:
        self.spans = [(i, start) for i, part in enumerate(self.parts)
                      for start in range(0, len(part), PIECE)]

    @property
    def total(self) -> int:
        return len(self.spans)

    def take(self, budget: int) -> tuple[list[Piece], int, int]:
        out: list[Piece] = []
        size, i = 0, self.done
        while i < len(self.spans) and (not out or size + PIECE <= budget):
            part, start = self.spans[i]
            chunk = self.parts[part][start:start + PIECE]
            piece = chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
            out.append((self.sid, i, piece))
            size += len(piece)
            i += 1
        return out, i, size

    def finish(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


class JournalApi(Protocol):
    """What the stamping path asks of a journal: `Journal` (this process commits), or
    `server.coordinator.CoordinatorLink` (the host's one journal commits)."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def record(self, req: Request, t: int, key_id: str | None = None) -> int: ...

    def signed(self, stamp_id: int, worker: str | None, attempts: int, object_id: str | None,
               receipt: str | None = None) -> None: ...

    async def signed_durably(self, stamp_id: int, worker: str | None, attempts: int,
                             receipt: str) -> None: ...

    def failed(self, stamp_id: int, error: str) -> None: ...

    async def failed_durably(self, stamp_id: int, error: str) -> None: ...

    async def signed_manifest_durably(self, stamp_id: int, worker: str | None, attempts: int,
                                      parts: tuple[Text, ...]) -> None: ...


def stamp_row(req: Request, t: int, key_id: str | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"commit": None, "tagname": None, "tree": None, "parent": None,
                           "algorithm": None, "digest": None, "stamped_at": t,
                           "key_id": key_id, "kind": req.kind}
    row.update(req.journal_fields())
    return row


class Journal:
    def __init__(self, engine: Engine, stats: Stats | None = None) -> None:
        self.engine = engine
        self.stats = stats or Stats()
        self._inserts: list[_Pending] = []
        self._updates: list[dict[str, Any]] = []
        self._update_waiters: list[asyncio.Future[None]] = []
        self._bulk: list[_Bulk] = []  # in the order they are written
        self._along: list[tuple[Writes, asyncio.Future[bool]]] = []  # (`write_along`)
        self._bulk_due = False  # the last commit left the bulk writes out: the next takes a slice
        self._update_timer: asyncio.TimerHandle | None = None
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="journal")
        self._writer: SqlAlchemyWriter | SqliteWriter
        if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
            self._writer = SqliteWriter(str(engine.url.database))
        else:
            self._writer = SqlAlchemyWriter(engine)
        self._task: asyncio.Task[None] | None = None
        self.commits = 0  # transactions written (for tests and metrics)

    @property
    def retries(self) -> int:
        """Group commits run again after a transient database error (deadlock, ...)."""
        return self._writer.retries

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="journal")

    async def stop(self) -> None:
        # Flush what is queued, then stop.
        if self._update_timer is not None:
            self._update_timer.cancel()
            self._update_timer = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._inserts or self._updates or self._bulk or self._along:
            if not await self._write_once():
                break
        await asyncio.get_running_loop().run_in_executor(self._executor, self._writer.shutdown)
        self._executor.shutdown(wait=True)

    async def record(self, req: Request, t: int, key_id: str | None = None) -> int:
        """Commit the request durably; return its stamp id. Raises `JournalError`."""
        return await self.record_row(stamp_row(req, t, key_id), req.digest_buckets())

    async def record_row(self, row: dict[str, Any], buckets: IndexRows | None = None) -> int:
        """Commit a stamp row (`stamp_row`) and, for a manifest, its digest buckets durably;
        return its stamp id. Raises `JournalError`."""
        return await self.record_row_nowait(row, buckets)

    def record_row_nowait(self, row: dict[str, Any], buckets: IndexRows | None = None
                          ) -> asyncio.Future[int]:
        """`record_row` without waiting: the future of its stamp id (or `JournalError`), set
        once the row and its buckets are committed."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._inserts.append(_Pending(row, fut, buckets))
        self._wake.set()
        return fut

    def signed(self, stamp_id: int, worker: str | None, attempts: int, object_id: str | None,
               receipt: str | None = None) -> None:
        """Record the outcome with the next group commit, or within `UPDATE_DELAY` (not awaited:
        the outcome is bookkeeping; the request itself was committed before signing)."""
        self._updates.append({"sid": stamp_id, "state": StampState.SIGNED, "worker": worker,
                              "attempts": attempts, "object_id": object_id, "error": None,
                              "receipt": receipt})
        self._schedule_updates()

    async def signed_durably(self, stamp_id: int, worker: str | None, attempts: int,
                             receipt: str) -> None:
        """Record the outcome and wait until it is committed (receipts can be fetched again)."""
        await self.signed_durably_nowait(stamp_id, worker, attempts, receipt)

    def signed_durably_nowait(self, stamp_id: int, worker: str | None, attempts: int,
                              receipt: str) -> asyncio.Future[None]:
        """`signed_durably` without waiting: the future of its commit."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._update_waiters.append(fut)
        self.signed(stamp_id, worker, attempts, None, receipt)
        self._wake.set()
        return fut

    async def signed_manifest_durably(self, stamp_id: int, worker: str | None, attempts: int,
                                      parts: TextParts) -> None:
        """Store a signed manifest's text (``parts``, whose concatenation it is) in pieces, and
        its outcome with the last of them; wait until that is committed."""
        await self.signed_manifest_durably_nowait(stamp_id, worker, attempts, parts)

    def signed_manifest_durably_nowait(self, stamp_id: int, worker: str | None, attempts: int,
                                       parts: TextParts) -> asyncio.Future[None]:
        """`signed_manifest_durably` without waiting: the future of its last commit."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._bulk.append(_TextPieces(stamp_id, fut, parts=parts, update={
            "sid": stamp_id, "state": StampState.SIGNED, "worker": worker,
            "attempts": attempts, "object_id": None, "error": None, "receipt": None}))
        self._wake.set()
        return fut

    def failed(self, stamp_id: int, error: str) -> None:
        self._updates.append({"sid": stamp_id, "state": StampState.FAILED, "worker": None,
                              "attempts": None, "object_id": None, "error": error[:1000],
                              "receipt": None})
        self._schedule_updates()

    async def failed_durably(self, stamp_id: int, error: str) -> None:
        """Record a failure and wait until it is committed (see `Stamper._failed`)."""
        await self.failed_durably_nowait(stamp_id, error)

    def failed_durably_nowait(self, stamp_id: int, error: str) -> asyncio.Future[None]:
        """`failed_durably` without waiting: the future of its commit."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._update_waiters.append(fut)
        self.failed(stamp_id, error)
        self._wake.set()
        return fut

    def write_along(self, writes: Writes) -> asyncio.Future[bool]:
        """Have a group commit run another writer's ``writes`` too (the transparency log's
        entries: on SQLite, a transaction of their own would hold up every stamp's commit
        while it holds the write lock); the future of whether they were kept
        (`server.db.Writes`), or `JournalError`. One set a commit, in the order given: what
        it adds to a commit, every stamp in it waits for."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._along.append((writes, fut))
        self._wake.set()
        return fut

    def _schedule_updates(self) -> None:
        """Outcomes ride along with the next insert; when none comes soon, flush them alone
        (so that an idle server does not pay a second commit per request)."""
        if self._update_timer is None:
            self._update_timer = asyncio.get_running_loop().call_later(
                UPDATE_DELAY, self._flush_updates)

    def _flush_updates(self) -> None:
        self._update_timer = None
        if self._updates:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self._write_once():
                await asyncio.sleep(0.5)  # the database is down: do not spin

    async def _write_once(self) -> bool:
        inserts, self._inserts = self._inserts, []
        updates, self._updates = self._updates, []
        waiters, self._update_waiters = self._update_waiters, []
        self._along = [a for a in self._along if not a[1].done()]
        along, self._along = self._along[:1], self._along[1:]
        # (a bulk write whose waiter is gone, a request timed out, is dropped: what it wrote
        # is never read, its stamp not being signed)
        bulk = self._bulk = [b for b in self._bulk if not b.future.done()]
        if not inserts and not updates and not bulk and not along:
            return True
        # A commit that someone waits for (a stamp's row, an outcome awaited) leaves the bulk
        # writes out, unless the last one did: a stamp waits for the slice being committed
        # when it came, not for one more in its own commit (a digest stamp's p99 beside 8
        # manifests of 127 MiB, bench.manifest_flood: 92-110 ms in six runs before; 77-109
        # ms in three with this), and the bulk writes still get every other commit however
        # busy the journal is.
        if bulk and (inserts or waiters) and not self._bulk_due:
            bulk = []
            self._bulk_due = True
        else:
            self._bulk_due = False
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            (ids, kept), progress = await loop.run_in_executor(
                self._executor, self._write, [p.row for p in inserts], updates, list(bulk),
                [w for w, _ in along])
        except Exception as e:
            log.exception("journal write of %d rows failed", len(inserts))
            # Completion updates are kept for the next transaction (bounded); the requests
            # that were not recorded fail now, before anything was signed for them, and so do
            # the bulk writes under way (a manifest not indexed is not signed; one whose text
            # is not stored is answered 503).
            self._updates = (updates + self._updates)[-100_000:]
            if self._updates:
                self._wake.set()
            self._update_waiters = waiters + self._update_waiters
            error = JournalError(f"journal unavailable: {type(e).__name__}")
            for p in inserts:
                if not p.future.done():
                    p.future.set_exception(error)
            for b in bulk:
                if not b.future.done():
                    b.future.set_exception(error)
            for _, fut in along:  # (those queued behind it go on: each is guarded)
                if not fut.done():
                    fut.set_exception(error)
            self._bulk = [b for b in self._bulk if b not in bulk]
            return False
        self.commits += 1
        self.stats.journal_commit.observe(time.perf_counter() - started)
        for w in waiters:
            if not w.done():
                w.set_result(None)
        for (_, fut), ok in zip(along, kept, strict=True):
            if not fut.done():
                fut.set_result(ok)
        for b, done in progress:
            b.done = done
            if done == b.total:
                b.finish()
                self._bulk.remove(b)
        for p, sid in zip(inserts, ids, strict=True):
            if p.buckets:  # its index rows next, a slice per commit; then its id
                self._bulk.append(_IndexRows(sid, p.future, algorithm=p.row["algorithm"],
                                             rows=p.buckets))
            elif not p.future.done():
                p.future.set_result(sid)
        if self._bulk or self._along:
            self._wake.set()  # the next slice, with whatever comes meanwhile
        return True

    def _write(self, rows: list[dict[str, Any]], updates: list[dict[str, Any]],
               bulk: Sequence[_Bulk] = (), along: Sequence[Writes] = ()
               ) -> tuple[tuple[list[int], list[bool]], list[tuple[_Bulk, int]]]:
        """One group commit (in the journal thread): ``rows`` inserted, ``updates`` applied,
        the next slice of the ``bulk`` writes, `BULK_BYTES` at most, and the ``along``
        writes; the inserted rows' ids and whether each of ``along`` was kept, and how far
        each bulk write then is."""
        budget = BULK_BYTES
        index: list[IndexRow] = []
        pieces: list[Piece] = []
        progress: list[tuple[_Bulk, int]] = []
        finished: list[dict[str, Any]] = []
        for b in bulk:
            if budget <= 0:
                break
            if isinstance(b, _IndexRows):
                more, done, size = b.take(budget)
                index += more
            else:
                assert isinstance(b, _TextPieces)
                texts, done, size = b.take(budget)
                pieces += texts
                if done == b.total:
                    finished.append(b.update)
            budget -= size
            progress.append((b, done))
        return self._writer.write(rows, updates + finished, index, pieces, along), progress


