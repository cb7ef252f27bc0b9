"""The journal: every accepted request is committed to the database before it is signed.

Writes are grouped: requests that arrive while one transaction is being committed all go into
the next one, so one durable commit (one fsync on SQLite) covers a whole group and the journal
never becomes the per-request bottleneck. Completion updates (worker, object id) ride along in
the same transactions; they are bookkeeping, not a precondition of the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, bindparam, insert, update

from server.errors import JournalError
from server.metrics import Stats
from server.models import Stamp, StampState
from server.receipts import DigestRequest
from workers.gitobjects import BranchRequest, TagRequest

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    row: dict[str, Any]
    future: asyncio.Future[int]


AnyRequest = TagRequest | BranchRequest | DigestRequest


def stamp_row(req: AnyRequest, t: int) -> dict[str, Any]:
    row: dict[str, Any] = {"commit": None, "tagname": None, "tree": None, "parent": None,
                           "algorithm": None, "digest": None, "stamped_at": t}
    if isinstance(req, TagRequest):
        row.update(kind="tag", commit=req.commit, tagname=req.tagname)
    elif isinstance(req, BranchRequest):
        row.update(kind="branch", commit=req.commit, tree=req.tree, parent=req.parent)
    else:
        row.update(kind="digest", algorithm=req.algorithm, digest=req.digest)
    return row


class Journal:
    def __init__(self, engine: Engine, stats: Stats | None = None) -> None:
        self.engine = engine
        self.stats = stats or Stats()
        self._inserts: list[_Pending] = []
        self._updates: list[dict[str, Any]] = []
        self._update_waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="journal")
        self._task: asyncio.Task[None] | None = None
        self.commits = 0  # transactions written (for tests and metrics)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="journal")

    async def stop(self) -> None:
        # Flush what is queued, then stop.
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._inserts or self._updates:
            await self._write_once()
        self._executor.shutdown(wait=True)

    async def record(self, req: AnyRequest, t: int) -> int:
        """Commit the request durably; return its stamp id. Raises `JournalError`."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._inserts.append(_Pending(stamp_row(req, t), fut))
        self._wake.set()
        return await fut

    def signed(self, stamp_id: int, worker: str | None, object_id: str | None,
               receipt: str | None = None) -> None:
        """Record the outcome in a later group commit (not awaited)."""
        self._updates.append({"sid": stamp_id, "state": StampState.SIGNED, "worker": worker,
                              "object_id": object_id, "error": None, "receipt": receipt})
        self._wake.set()

    async def signed_durably(self, stamp_id: int, worker: str | None, receipt: str) -> None:
        """Record the outcome and wait until it is committed (receipts can be fetched again)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._update_waiters.append(fut)
        self.signed(stamp_id, worker, None, receipt)
        await fut

    def failed(self, stamp_id: int, error: str) -> None:
        self._updates.append({"sid": stamp_id, "state": StampState.FAILED, "worker": None,
                              "object_id": None, "error": error[:1000], "receipt": None})
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
        if not inserts and not updates:
            return True
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            ids = await loop.run_in_executor(
                self._executor, self._write, [p.row for p in inserts], updates
            )
        except Exception as e:
            log.exception("journal write of %d rows failed", len(inserts))
            # Completion updates are kept for the next transaction (bounded); the requests
            # that were not recorded fail now, before anything was signed for them.
            self._updates = (updates + self._updates)[-100_000:]
            if self._updates:
                self._wake.set()
            self._update_waiters = waiters + self._update_waiters
            for p in inserts:
                if not p.future.done():
                    p.future.set_exception(JournalError(f"journal unavailable: {type(e).__name__}"))
            return False
        self.commits += 1
        self.stats.journal_commit.observe(loop.time() - started)
        for w in waiters:
            if not w.done():
                w.set_result(None)
        for p, sid in zip(inserts, ids, strict=True):
            if not p.future.done():
                p.future.set_result(sid)
        return True

    def _write(self, rows: list[dict[str, Any]], updates: list[dict[str, Any]]) -> list[int]:
        table = Stamp.__table__
        with self.engine.begin() as conn:
            ids: list[int] = []
            if rows:
                result = conn.execute(
                    insert(table).returning(table.c.id, sort_by_parameter_order=True),
                    [{**r, "state": StampState.PENDING, "attempts": 1} for r in rows],
                )
                ids = [row[0] for row in result]
            if updates:
                conn.execute(
                    update(table)
                    .where(table.c.id == bindparam("sid"))
                    .values(state=bindparam("state"), worker=bindparam("worker"),
                            object_id=bindparam("object_id"), error=bindparam("error"),
                            receipt=bindparam("receipt")),
                    updates,
                )
        return ids
