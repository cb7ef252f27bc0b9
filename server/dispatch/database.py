"""Dispatch through PostgreSQL, for several hosts (``STAMPD_DISPATCH=database``).

The statements on the ``jobs`` and ``worker_heartbeats`` tables, the job states and the
channels are `workers.jobtable`'s (the workers run the same module).

API hosts insert jobs into the ``jobs`` table and ``NOTIFY stampd_jobs``; worker hosts
(``stampd worker``) claim them with ``FOR UPDATE SKIP LOCKED``, sign, store the result only if
they still own the claim, and ``NOTIFY stampd_done, '<id>'``. The API side waits on ``LISTEN
stampd_done`` (no polling in the request's latency; a once-a-second sweep only catches
notifications lost with a dropped connection).

Workers send heartbeats. A reaper, run by every API host (its statements are idempotent and
never wait for a row lock, so reapers running at once cannot deadlock), puts jobs back in the
queue when their worker's heartbeat stopped or the claim is older than the signing timeout.
Transient database errors (deadlock, serialization failure, a lost connection) run a
transaction again a bounded number of times (`server.db.run_transaction`). A signature that
a dead worker made but did not record is never issued: only a recorded result is returned,
so a retried job is signed anew and answered once.
The same `server.dispatch.Dispatcher` protocol as the socket transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

from sqlalchemy import URL, Connection, CursorResult, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

from formats.jobs import Job, JobState, encode_job
from formats.keys import PRIMARY
from server import db
from server.dispatch import Signed, Worker
from server.errors import QueueFull, SigningFailed, Unavailable
from server.stats import Stats
from workers import jobtable

log = logging.getLogger(__name__)

# Seconds a finished job stays in the table before the reaper deletes it: well past the
# longest a request waits for it (STAMPD_REQUEST_TIMEOUT, at most 25 s).
KEEP_FINISHED = 60.0


def psycopg_dsn(url: Engine | URL | str) -> str:
    """The libpq DSN (password included: keep it out of logs) of a SQLAlchemy URL."""
    if isinstance(url, Engine):
        url = url.url
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def execute(conn: Connection, sql: jobtable.Sql) -> CursorResult[Any]:
    """Run a `workers.jobtable` statement (psycopg's placeholders) on ``conn``."""
    return conn.exec_driver_sql(sql.text, sql.params)


class DbDispatcher:
    def __init__(self, engine: Engine, *, max_queue: int = 5000, sign_timeout: float = 10.0,
                 max_attempts: int = 3, heartbeat_timeout: float = 10.0,
                 stats: Stats | None = None) -> None:
        self.engine = engine
        self.dsn = psycopg_dsn(engine)
        self.max_queue = max_queue
        self.sign_timeout = sign_timeout
        self.max_attempts = max_attempts
        self.heartbeat_timeout = heartbeat_timeout
        self.stats = stats or Stats()
        self.requeued = 0
        self.workers: dict[str, Worker] = {}
        self._waiting: dict[int, asyncio.Future[Signed]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._reaper: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._listener = threading.Thread(target=self._listen, name="jobs-listener",
                                          daemon=True)
        self._listener.start()
        self._reaper = asyncio.create_task(self._reap_loop(), name="jobs-reaper")

    async def stop(self) -> None:
        self._stop.set()
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        if self._listener is not None:
            await asyncio.to_thread(self._listener.join, 5)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(Unavailable("server is shutting down"))

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    def keys_served(self) -> set[str]:
        return {w.key for w in self.workers.values()}

    # -- the API for the HTTP side ---------------------------------------------------------
    async def sign(self, job: Job, key: str = PRIMARY, *, internal: bool = False) -> Signed:
        if len(self._waiting) >= self.max_queue and not internal:
            raise QueueFull("too many stamps waiting; retry shortly")
        try:
            job_id = await asyncio.to_thread(self._insert, encode_job(job), key)
        except (SQLAlchemyError, db.CommitUnknown) as e:
            log.warning("could not queue a job: %s: %s", type(e).__name__, e)
            raise Unavailable("database unavailable; retry later") from e
        fut = asyncio.get_running_loop().create_future()
        self._waiting[job_id] = fut
        try:
            return await fut
        finally:
            self._waiting.pop(job_id, None)

    def _insert(self, payload: str, key: str) -> int:
        # Run again after a transient error, but not after a connection lost during COMMIT
        # (the job may be queued already: `server.db.CommitUnknown` fails the request).
        def work(conn: Connection) -> int:
            job_id = execute(conn, jobtable.enqueue(key, payload, time.time())).scalar_one()
            execute(conn, jobtable.notify_queued())
            return int(job_id)

        return db.run_transaction(self.engine, work, what="enqueue a job")

    # -- results -------------------------------------------------------------------------------
    def _listen(self) -> None:
        """LISTEN for finished jobs; reconnect when the connection drops."""
        import psycopg  # only database dispatch needs it: not imported at start-up

        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(jobtable.LISTEN_DONE)
                    self._sweep()  # results that finished while we were not listening
                    last_sweep = time.monotonic()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0, stop_after=64):
                            with contextlib.suppress(ValueError):
                                self._finish([int(note.payload)])
                        if time.monotonic() - last_sweep >= 1.0:
                            self._sweep()
                            last_sweep = time.monotonic()
            except psycopg.Error as e:
                log.warning("jobs listener: %s; reconnecting", e)
                self._stop.wait(1.0)

    def _sweep(self) -> None:
        self._finish(list(self._waiting.copy()))  # (copy: the event loop mutates it)

    def _finish(self, ids: list[int]) -> None:
        """Resolve the requests of this process among ``ids`` whose jobs are finished.
        (Every API host hears every notification; jobs of other hosts are skipped here.)"""
        waiting = self._waiting.copy()  # the event loop mutates it; copying is atomic
        ids = [i for i in ids if i in waiting]
        if not ids:
            return

        def read() -> list[Any]:
            with self.engine.connect() as conn:
                return list(execute(conn, jobtable.finished(ids)).all())

        rows = db.retry_transient(read, what="read finished jobs")
        assert self._loop is not None
        for row in rows:
            self._loop.call_soon_threadsafe(self._resolve, row.id, row.state, row.result,
                                            row.worker, row.error, row.attempts)

    def _resolve(self, job_id: int, state: str, result: str | None, worker: str | None,
                 error: str | None, attempts: int) -> None:
        fut = self._waiting.get(job_id)
        if fut is None or fut.done():
            return
        if state == JobState.DONE and result is not None:
            fut.set_result(Signed(result, worker or "?", attempts))
        else:
            fut.set_exception(SigningFailed(error or "signing failed; retry later"))

    # -- the reaper ------------------------------------------------------------------------------
    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await asyncio.to_thread(self.reap)
            except Exception:
                log.exception("jobs reaper failed")

    def reap(self) -> None:
        now = time.time()
        dead = now - self.heartbeat_timeout

        # Its statements never wait for a row lock (`workers.jobtable.reap`), so several API
        # hosts reaping at once cannot deadlock; a lost connection runs it again (idempotent:
        # a second run finds nothing left to take, and the sweep resolves failed jobs).
        def work(conn: Connection) -> tuple[list[Any], list[Any], list[Any]]:
            alive = list(execute(conn, jobtable.live_workers(dead)).all())
            # Claims of dead or late workers: back to the queue, or failed after max attempts.
            taken = execute(conn, jobtable.reap(self.max_attempts, now - self.sign_timeout,
                                                dead)).all()
            requeued = [r for r in taken if r.state == JobState.QUEUED]
            failed = [r for r in taken if r.state == JobState.FAILED]
            if requeued:
                execute(conn, jobtable.notify_queued())
            if failed:
                execute(conn, jobtable.notify_done(failed[0].id))
            execute(conn, jobtable.prune_heartbeats(now - 3600))
            execute(conn, jobtable.prune_finished(now - KEEP_FINISHED))
            return alive, requeued, failed

        alive, requeued, failed = db.run_transaction(self.engine, work, what="reap jobs",
                                                     idempotent=True)
        self.workers = {r.name: Worker(r.name, r.key_id, r.pid) for r in alive}
        if requeued:
            self.requeued += len(requeued)
            log.warning("requeued %d jobs of dead or late workers", len(requeued))
        if failed:
            self._finish([r.id for r in failed])
