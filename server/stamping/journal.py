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
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sqlalchemy import Connection, Engine, Table, bindparam, func, insert, or_, update

from formats.manifests import key_prefix
from server import db
from server.errors import JournalError
from server.models import ManifestDigests, Stamp, StampState
from server.stamping.requests import Request
from server.stats import Stats

log = logging.getLogger(__name__)

UPDATE_DELAY = 0.5  # seconds an outcome may wait for the next group commit
# The states whose stamp takes an outcome: pending, and orphaned (published by the logs as
# pending too long: a process that was only stalled may record its outcome after all).
OUTCOME_PENDING = (StampState.PENDING, StampState.ORPHANED)


# A manifest's digest index rows: (bucket key, packed digests) (`formats.manifests.buckets`).
Buckets = list[tuple[int, bytes]]


@dataclass
class _Pending:
    row: dict[str, Any]
    future: asyncio.Future[int]
    buckets: Buckets | None = None  # manifests: written in the same transaction


class JournalApi(Protocol):
    """What the stamping path asks of a journal: `Journal` (this process commits), or
    `server.stamping.journal_host.RemoteJournal` (the host's one journal commits)."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def record(self, req: Request, t: int, key_id: str | None = None) -> int: ...

    def signed(self, stamp_id: int, worker: str | None, attempts: int, object_id: str | None,
               receipt: str | None = None) -> None: ...

    async def signed_durably(self, stamp_id: int, worker: str | None, attempts: int,
                             receipt: str) -> None: ...

    def failed(self, stamp_id: int, error: str) -> None: ...

    async def failed_durably(self, stamp_id: int, error: str) -> None: ...


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
        self._update_timer: asyncio.TimerHandle | None = None
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="journal")
        self._writer: _SqlAlchemyWriter | _SqliteWriter
        if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
            self._writer = _SqliteWriter(str(engine.url.database))
        else:
            self._writer = _SqlAlchemyWriter(engine)
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
        if self._inserts or self._updates:
            await self._write_once()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._writer.close)
        self._executor.shutdown(wait=True)

    async def record(self, req: Request, t: int, key_id: str | None = None) -> int:
        """Commit the request durably; return its stamp id. Raises `JournalError`."""
        return await self.record_row(stamp_row(req, t, key_id), req.digest_buckets())

    async def record_row(self, row: dict[str, Any], buckets: Buckets | None = None) -> int:
        """Commit a stamp row (`stamp_row`) and, for a manifest, its digest buckets durably;
        return its stamp id. Raises `JournalError`."""
        return await self.record_row_nowait(row, buckets)

    def record_row_nowait(self, row: dict[str, Any], buckets: Buckets | None = None
                          ) -> asyncio.Future[int]:
        """`record_row` without waiting: the future of its stamp id (or `JournalError`)."""
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
        if not inserts and not updates:
            return True
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            ids = await loop.run_in_executor(
                self._executor, self._write, [p.row for p in inserts], updates,
                {i: p.buckets for i, p in enumerate(inserts) if p.buckets is not None}
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
        self.stats.journal_commit.observe(time.perf_counter() - started)
        for w in waiters:
            if not w.done():
                w.set_result(None)
        for p, sid in zip(inserts, ids, strict=True):
            if not p.future.done():
                p.future.set_result(sid)
        return True

    def _write(self, rows: list[dict[str, Any]], updates: list[dict[str, Any]],
               buckets: dict[int, Buckets] | None = None) -> list[int]:
        return self._writer.write(rows, updates, buckets or {})


INSERT_COLUMNS = ("kind", "commit", "tagname", "tree", "parent", "algorithm", "digest",
                  "stamped_at", "key_id", "state", "attempts")


class _Writer:
    """Holds the journal thread's one connection; a failed write drops it (rolling back
    whatever was open) and the next write connects anew."""

    conn: Connection | sqlite3.Connection | None = None
    retries = 0  # transactions run again after a transient error

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None


class _SqlAlchemyWriter(_Writer):
    """Any database: one connection kept open by the journal thread (no pool round trip).

    On PostgreSQL several API hosts (and the log committer) write ``stamps`` at once, so two
    rules keep a group commit from deadlocking or failing a whole group under contention:

    - Row locks are taken in one order. The only existing rows a group commit locks are those
      its outcomes update, one statement per row in ascending id order (a stable sort, so two
      outcomes of one stamp keep theirs). Every writer that follows the same order waits for
      the other's commit instead of holding a row the other waits for; inserted rows are new
      and no other transaction waits for them (the ids come from a sequence).
    - A transient error (`server.db.is_transient`: deadlock, serialization failure, a lost
      connection) rolls the group back; it is run again, a bounded number of times. That is
      idempotent: the outcomes only touch rows without one (``pending``, ``orphaned``) and set
      the same values again, and a group that inserts requests is never run again after the
      connection was lost during its COMMIT (`server.db.CommitUnknown`: it may have
      committed): its requests fail (503) and nothing is recorded twice.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.conn: Connection | None = None
        self.retries = 0  # groups run again after a transient error (for tests and logs)

    def write(self, rows: list[dict[str, Any]], updates: list[dict[str, Any]],
              buckets: dict[int, Buckets]) -> list[int]:
        ordered = sorted(updates, key=lambda u: int(u["sid"]))
        return db.retry_transient(lambda: self._write(rows, ordered, buckets),
                                  what="journal write", on_retry=self._retried)

    def _retried(self, _error: BaseException) -> None:
        self.retries += 1

    def _write(self, rows: list[dict[str, Any]], updates: list[dict[str, Any]],
               buckets: dict[int, Buckets]) -> list[int]:
        if self.conn is None or self.conn.closed or self.conn.invalidated:
            self.conn = self.engine.connect()
        table = cast(Table, Stamp.__table__)
        try:
            tx = self.conn.begin()
            try:
                ids: list[int] = []
                if rows:
                    result = self.conn.execute(
                        insert(table).returning(table.c.id, sort_by_parameter_order=True),
                        [{**r, "state": StampState.PENDING, "attempts": 0} for r in rows],
                    )
                    ids = [row[0] for row in result]
                for i, rows_of in buckets.items():
                    self._insert_buckets(ids[i], rows[i]["algorithm"], rows_of)
                if updates:
                    self.conn.execute(
                        update(table)
                        .where(table.c.id == bindparam("sid"),
                               # (no IN: an expanding parameter, not in an executemany)
                               or_(*(table.c.state == s for s in OUTCOME_PENDING)))
                        .values(state=bindparam("state"), worker=bindparam("worker"),
                                attempts=func.coalesce(bindparam("attempts"), table.c.attempts),
                                object_id=bindparam("object_id"), error=bindparam("error"),
                                receipt=bindparam("receipt")),
                        updates,
                    )
            except BaseException:
                with contextlib.suppress(Exception):
                    tx.rollback()
                raise
            # Outcomes alone may be committed twice; inserted requests may not.
            db.commit(tx, idempotent=not rows)
            return ids
        except Exception:
            self.close()
            raise


    def _insert_buckets(self, stamp_id: int, algorithm: str, rows: Buckets) -> None:
        """A manifest's digest index rows (about 65,536 for a million digests): COPY on
        PostgreSQL, in the group's transaction (a third of the time of an executemany INSERT
        here)."""
        assert self.conn is not None
        if self.engine.dialect.name != "postgresql":
            self.conn.execute(insert(cast(Table, ManifestDigests.__table__)), [
                {"stamp_id": stamp_id, "prefix": key_prefix(b), "algorithm": algorithm,
                 "digests": packed}
                for b, packed in rows])
            return
        raw = self.conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur, cur.copy(
                "COPY manifest_digests (stamp_id, prefix, algorithm, digests) "
                "FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "bytea", "varchar", "bytea"])
            for b, packed in rows:
                copy.write_row((stamp_id, key_prefix(b), algorithm, packed))


class _SqliteWriter(_Writer):
    """SQLite: the journal thread's own sqlite3 connection and prepared statements.

    The same SQL SQLAlchemy would emit, without its per-statement work, which dominated the
    journal's cost at thousands of stamps per second. One multi-row INSERT per group; rowids
    are assigned in VALUES order while the write lock is held, so the sorted RETURNING ids
    match the rows.
    """

    CHUNK = 200  # rows per INSERT (x 11 parameters, far below SQLite's variable limit)
    # Only a stamp without an outcome takes one (a re-applied update must not undo the log
    # committer's marking of a failed stamp).
    UPDATE = ("UPDATE stamps SET state = ?, worker = ?, attempts = COALESCE(?, attempts), "
              "object_id = ?, error = ?, receipt = ? WHERE id = ? "
              f"AND state IN ('{StampState.PENDING}', '{StampState.ORPHANED}')")

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn: sqlite3.Connection | None = None
        self._inserts: dict[int, str] = {}

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=30,
                               check_same_thread=False)
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON",
                       "busy_timeout=30000"):
            conn.execute(f"PRAGMA {pragma}")
        return conn

    def _insert_sql(self, n: int) -> str:
        sql = self._inserts.get(n)
        if sql is None:
            cols = ", ".join(f'"{c}"' for c in INSERT_COLUMNS)
            one = "(" + ", ".join("?" * len(INSERT_COLUMNS)) + ")"
            sql = f"INSERT INTO stamps ({cols}) VALUES {', '.join([one] * n)} RETURNING id"
            self._inserts[n] = sql
        return sql

    def write(self, rows: list[dict[str, Any]], updates: list[dict[str, Any]],
              buckets: dict[int, Buckets]) -> list[int]:
        conn = self.conn = self.conn or self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            ids: list[int] = []
            for i in range(0, len(rows), self.CHUNK):
                chunk = rows[i:i + self.CHUNK]
                params = [v for r in chunk for v in (
                    r["kind"], r["commit"], r["tagname"], r["tree"], r["parent"],
                    r["algorithm"], r["digest"], r["stamped_at"], r["key_id"],
                    StampState.PENDING, 0)]
                got = sorted(row[0] for row in conn.execute(self._insert_sql(len(chunk)), params))
                if len(got) != len(chunk):
                    raise RuntimeError("INSERT returned the wrong number of ids")
                ids += got
            for i, rows_of in buckets.items():
                conn.executemany(
                    "INSERT INTO manifest_digests (stamp_id, prefix, algorithm, digests) "
                    "VALUES (?, ?, ?, ?)",
                    [(ids[i], key_prefix(b), rows[i]["algorithm"], packed)
                     for b, packed in rows_of])
            if updates:
                conn.executemany(self.UPDATE, [
                    (u["state"], u["worker"], u["attempts"], u["object_id"], u["error"],
                     u["receipt"], u["sid"])
                    for u in updates])
            conn.execute("COMMIT")
            return ids
        except BaseException:
            self.close()
            raise

