"""Dispatch through PostgreSQL, for several hosts (``STAMPD_DISPATCH=database``).

API hosts insert jobs into the ``jobs`` table and ``NOTIFY stampd_jobs``; worker hosts
(``stampd worker``) claim them with ``FOR UPDATE SKIP LOCKED``, sign, store the result only if
they still own the claim, and ``NOTIFY stampd_done, '<id>'``. The API side waits on ``LISTEN
stampd_done`` (no polling in the request's latency; a once-a-second sweep only catches
notifications lost with a dropped connection).

Workers send heartbeats. A reaper, run by every API host (its statements are idempotent),
puts jobs back in the queue when their worker's heartbeat stopped or the claim is older than
the signing timeout. A signature that a dead worker made but did not record is never issued:
only a recorded result is returned, so a retried job is signed anew and answered once.
Same interface as `server.dispatch.Dispatcher`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import Engine, text

from server.dispatch import Signed
from server.errors import QueueFull, SigningFailed, Unavailable
from server.metrics import Stats
from workers.keyset import PRIMARY

log = logging.getLogger(__name__)

JOBS_CHANNEL = "stampd_jobs"
DONE_CHANNEL = "stampd_done"


def psycopg_dsn(engine: Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass
class WorkerView:
    name: str
    key: str
    pid: int


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
        self.workers: dict[str, WorkerView] = {}
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
    async def sign(self, payload: dict[str, Any], key: str = PRIMARY) -> Signed:
        if len(self._waiting) >= self.max_queue:
            raise QueueFull("too many stamps waiting; retry shortly")
        job_id = await asyncio.to_thread(self._insert, payload, key)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[job_id] = fut
        try:
            return await fut
        finally:
            self._waiting.pop(job_id, None)

    def _insert(self, payload: dict[str, Any], key: str) -> int:
        with self.engine.begin() as conn:
            job_id = conn.execute(text(
                "INSERT INTO jobs (key_id, payload, state, attempts, created_at) "
                "VALUES (:k, :p, 'queued', 0, :t) RETURNING id"),
                {"k": key, "p": json.dumps(payload), "t": time.time()}).scalar_one()
            conn.execute(text(f"NOTIFY {JOBS_CHANNEL}"))
        return int(job_id)

    # -- results -------------------------------------------------------------------------------
    def _listen(self) -> None:
        """LISTEN for finished jobs; reconnect when the connection drops."""
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {DONE_CHANNEL}")
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
        with self.engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT id, state, result, worker, error FROM jobs "
                "WHERE id = ANY(:ids) AND state IN ('done', 'failed')"), {"ids": ids}).all()
        assert self._loop is not None
        for row in rows:
            self._loop.call_soon_threadsafe(self._resolve, row.id, row.state, row.result,
                                            row.worker, row.error)

    def _resolve(self, job_id: int, state: str, result: str | None, worker: str | None,
                 error: str | None) -> None:
        fut = self._waiting.get(job_id)
        if fut is None or fut.done():
            return
        if state == "done" and result is not None:
            fut.set_result(Signed(result, worker or "?"))
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
        with self.engine.begin() as conn:
            alive = conn.execute(text(
                "SELECT name, key_id, pid FROM worker_heartbeats WHERE last_seen >= :d"),
                {"d": dead}).all()
            self.workers = {r.name: WorkerView(r.name, r.key_id, r.pid) for r in alive}
            # Claims of dead or late workers: back to the queue, or failed after max attempts.
            taken = conn.execute(text(
                "UPDATE jobs SET "
                "state = CASE WHEN attempts < :max THEN 'queued' ELSE 'failed' END, "
                "worker = CASE WHEN attempts < :max THEN NULL ELSE worker END, "
                "claimed_at = CASE WHEN attempts < :max THEN NULL ELSE claimed_at END, "
                "error = CASE WHEN attempts < :max THEN error "
                "ELSE 'signing failed too often' END "
                "WHERE state = 'claimed' AND (claimed_at < :late "
                "OR worker NOT IN (SELECT name FROM worker_heartbeats WHERE last_seen >= :d)) "
                "RETURNING id, state"), {"max": self.max_attempts, "late": now - self.sign_timeout,
                                         "d": dead}).all()
            requeued = [r for r in taken if r.state == "queued"]
            failed = [r for r in taken if r.state == "failed"]
            if requeued:
                conn.execute(text(f"NOTIFY {JOBS_CHANNEL}"))
            if failed:
                conn.execute(text(f"NOTIFY {DONE_CHANNEL}, '{failed[0].id}'"))
            conn.execute(text(
                "DELETE FROM worker_heartbeats WHERE last_seen < :old"), {"old": now - 3600})
        if requeued:
            self.requeued += len(requeued)
            log.warning("requeued %d jobs of dead or late workers", len(requeued))
        if failed:
            self._finish([r.id for r in failed])
