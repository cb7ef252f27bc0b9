"""Socket dispatch (one host): hands signing jobs to worker processes and back, as frames of
the job contract (`formats.jobs`). It runs in ``stampd serve``: in its HTTP process's event loop
when it serves alone, else in the host's coordinator (`server.coordinator`), to which the HTTP
processes hand their jobs; one dispatcher knows every job of the host.

Every worker connects once, to ``stampd serve``'s Unix socket (``<data_dir>/run/serve.sock``),
and receives jobs over it.
Each connection keeps up to ``depth`` jobs in flight, so a worker never waits for a round trip;
there is no polling anywhere. When a connection drops (the worker or its agent died) or a job
times out, the jobs that were in flight go back to the front of the queue and another worker
signs them. A job that failed ``max_attempts`` times fails with `SigningFailed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats.frames import HEADER, decode_frame, frame_size
from formats.jobs import (
    Hello,
    Job,
    MalformedMessage,
    ManifestJob,
    RelayedJob,
    Result,
    is_manifest,
    job_frame_parts,
)
from formats.keys import PRIMARY
from server.dispatch import Signed
from server.errors import QueueFull, SigningFailed, Unavailable
from server.settings import Settings
from server.stats import Stats

log = logging.getLogger(__name__)

# Queue priorities: retried jobs first, then the service's own (``internal``), then new ones.
RETRY, INTERNAL, NEW = 0, 1, 2


@dataclass
class Pending:
    """A job waiting for, or held by, a worker."""

    job: Job | RelayedJob
    future: asyncio.Future[Signed]
    key: str = PRIMARY
    attempts: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class WorkerInfo:
    name: str
    pid: int
    fingerprint: str
    key: str = PRIMARY


class SocketDispatcher:
    """The `Dispatcher` of one host: workers connect to a Unix socket."""

    def __init__(
        self,
        socket_path: Path | None,
        *,
        max_queue: int = 5000,
        sign_timeout: float = 30.0,
        max_attempts: int = 3,
        depth: int = 4,
        stats: Stats | None = None,
        on_workers: Callable[[], None] = lambda: None,
    ) -> None:
        self.stats = stats or Stats()
        self.socket_path = socket_path
        self.max_queue = max_queue
        self.sign_timeout = sign_timeout
        self.max_attempts = max_attempts
        self.depth = depth
        # One queue per key: a job waits for a worker that holds the key it asked for.
        self._queues: dict[str, asyncio.PriorityQueue[tuple[int, int, Pending]]] = {}
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._outstanding = 0
        self._server: asyncio.AbstractServer | None = None
        self._conn_tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.workers: dict[str, WorkerInfo] = {}
        # A manifest signs for seconds: while it does, its worker takes nothing else. So that
        # stamps still find a worker, at most all but one of a key's workers sign manifests;
        # the manifests beyond wait here (in their order) until one is signed.
        self._manifests_out: dict[str, int] = {}
        self._held_back: dict[str, list[tuple[int, int, Pending]]] = {}
        self.requeued = 0  # jobs handed to another worker after a fault (for tests, metrics)
        self.on_workers = on_workers  # called when a worker connects or goes

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Listen on `socket_path`; none: the workers come through `serve_worker` (the
        host's coordinator listens, and hands them over)."""
        if self.socket_path is None:
            return
        self.socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        log.info("dispatcher listening on %s", self.socket_path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        # The socket goes before the workers are hung up on: a worker that finds it gone
        # knows this dispatcher stopped (quiet), not that its server died (a warning).
        if self.socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        # Hang up on the workers; their handlers then finish on their own (no cancellation).
        for writer in list(self._writers):
            writer.transport.abort()
        if self._conn_tasks:
            await asyncio.wait(set(self._conn_tasks), timeout=5)
        for key in list(self._held_back):
            self._release_held(key)
        for queue in self._queues.values():
            while not queue.empty():
                _, _, job = queue.get_nowait()
                if not job.future.done():
                    job.future.set_exception(Unavailable("server is shutting down"))

    @property
    def queue_depth(self) -> int:
        return sum(q.qsize() for q in self._queues.values())

    def queue(self, key: str) -> asyncio.PriorityQueue[tuple[int, int, Pending]]:
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = asyncio.PriorityQueue()
        return q

    def keys_served(self) -> set[str]:
        return {w.key for w in self.workers.values()}

    # -- the API for the HTTP side -------------------------------------------------------
    async def sign(self, job: Job | RelayedJob, key: str = PRIMARY, *,
                   internal: bool = False) -> Signed:
        """Have a worker holding ``key`` build and sign ``job`` (`Dispatcher.sign`)."""
        return await self.submit(job, key, internal=internal)

    def submit(self, job: Job | RelayedJob, key: str = PRIMARY, *,
               internal: bool = False) -> asyncio.Future[Signed]:
        """`sign` without a task: the future of ``job``'s answer (`QueueFull` at once when too
        many wait, unless the job is ``internal``: the service's own, which also goes ahead
        of new clients' jobs). Cancelling it drops the job, unless a worker has it already."""
        if self._outstanding >= self.max_queue and not internal:
            raise QueueFull("too many stamps waiting; retry shortly")
        pending = Pending(job=job, future=asyncio.get_running_loop().create_future(), key=key)
        self._outstanding += 1
        pending.future.add_done_callback(self._done)
        self.queue(key).put_nowait((INTERNAL if internal else NEW, next(self._seq), pending))
        return pending.future

    def _done(self, _future: asyncio.Future[Signed]) -> None:
        self._outstanding -= 1

    # -- manifests: all but one worker of a key at most ------------------------------------
    def _hold_back(self, key: str, item: tuple[int, int, Pending]) -> bool:
        """Keep back a manifest job that would leave no worker of ``key`` free for stamps."""
        if not is_manifest(item[2].job):
            return False
        serving = sum(1 for w in self.workers.values() if w.key == key)
        if serving > 1 and self._manifests_out.get(key, 0) >= serving - 1:
            self._held_back.setdefault(key, []).append(item)
            return True
        self._manifests_out[key] = self._manifests_out.get(key, 0) + 1
        return False

    def _manifest_done(self, key: str) -> None:
        self._manifests_out[key] = max(0, self._manifests_out.get(key, 0) - 1)
        self._release_held(key)

    def _release_held(self, key: str) -> None:
        """The manifests held back for ``key`` go back into its queue (each taken again is
        judged again)."""
        for item in self._held_back.pop(key, []):
            self.queue(key).put_nowait(item)

    # -- worker connections --------------------------------------------------------------
    def _requeue(self, job: Pending, reason: str) -> None:
        if job.future.done():
            return
        job.errors.append(reason)
        if job.attempts >= self.max_attempts:
            log.error("giving up on job after %d attempts: %s", job.attempts, job.errors)
            job.future.set_exception(
                SigningFailed(f"signing failed {job.attempts} times; retry later")
            )
            return
        self.requeued += 1
        self.queue(job.key).put_nowait((RETRY, next(self._seq), job))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.serve_worker(reader, writer)

    async def serve_worker(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           first: dict[str, Any] | None = None) -> None:
        """Serve the worker on this connection until it goes; ``first``: its hello, if it has
        been read."""
        task = asyncio.current_task()
        assert task is not None
        self._conn_tasks.add(task)
        self._writers.add(writer)
        inflight: dict[int, Pending] = {}
        info: WorkerInfo | None = None
        try:
            hello = Hello.from_dict(first if first is not None
                                    else await asyncio.wait_for(_read_frame(reader), 30))
            info = WorkerInfo(name=hello.worker, pid=hello.pid, fingerprint=hello.fingerprint,
                              key=hello.key)
            self.workers[info.name] = info
            self.on_workers()
            log.info("worker %s (pid %d) connected", info.name, info.pid)
            await self._serve(info, reader, writer, inflight)
        except asyncio.IncompleteReadError as e:
            if e.partial or inflight:
                log.warning("worker %s connection lost: %r", info.name if info else "?", e)
            else:
                log.info("worker %s disconnected", info.name if info else "?")
        except (ConnectionError, MalformedMessage, ValueError, TimeoutError) as e:
            log.warning("worker %s connection lost: %r", info.name if info else "?", e)
        finally:
            if info is not None:
                self.workers.pop(info.name, None)
                self.stats.worker_disconnects += 1
                self.on_workers()
            for job in inflight.values():
                if is_manifest(job.job):
                    self._manifest_done(job.key)
                self._requeue(job, f"worker {info.name if info else '?'} went away")
            inflight.clear()
            if info is not None:  # one worker fewer: what was held back is judged again
                self._release_held(info.key)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._conn_tasks.discard(task)
            self._writers.discard(writer)

    async def _serve(
        self,
        info: WorkerInfo,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        inflight: dict[int, Pending],
    ) -> None:
        loop = asyncio.get_running_loop()
        deadlines: dict[int, float] = {}
        sent: dict[int, float] = {}
        signing = self.stats.signing[info.name]
        # Job slots of this worker; the reader below gives them back. A manifest takes them
        # all: nothing waits behind it in the worker (it signs for seconds).
        free = [self.depth]
        slots: dict[int, int] = {}
        queue = self.queue(info.key)
        freed = asyncio.Event()

        async def feed() -> None:
            while True:
                while free[0] <= 0:
                    freed.clear()
                    await freed.wait()
                # (the jobs are held by `send` alone: while this waits for the next one it
                # holds none, or a manifest's 127 MiB of lines stayed alive until the worker's
                # next job)
                await send(await queue.get())

        async def send(item: tuple[int, int, Pending]) -> None:
            # Hand over every job that is ready and fits, in one write; a manifest's lines
            # (raw bytes after its frame) a piece at a time, each written when the last one
            # has gone (the transport holds a piece, not a copy of the manifest).
            frames: list[bytes | memoryview] = []
            now = loop.time()
            t0 = time.perf_counter()
            while True:
                job = item[2]
                # (a job whose future is done: its client went away or timed out)
                if not job.future.done() and not self._hold_back(info.key, item):
                    job_id = next(self._ids)
                    job.attempts += 1
                    inflight[job_id] = job
                    deadlines[job_id] = now + self.sign_timeout + _extra_time(job.job)
                    sent[job_id] = t0
                    head, pieces = job_frame_parts(job_id, job.job)
                    frames.append(head)
                    slots[job_id] = self.depth if is_manifest(job.job) else 1
                    free[0] -= slots[job_id]
                    for piece in pieces:
                        frames.append(piece)
                        writer.write(b"".join(frames))
                        frames = []
                        await writer.drain()
                        # A turn of the loop per piece, whether drain() waited or not: in
                        # a loaded server a manifest's pieces were seen going out in one
                        # callback that held the loop for 90-120 ms.
                        await asyncio.sleep(0)
                if free[0] <= 0 or queue.empty():
                    break
                item = queue.get_nowait()
            if frames:
                writer.write(b"".join(frames))

        def release(job_id: int) -> tuple[Pending | None, float | None]:
            """Job ``job_id`` is answered: its slots are free again; the job, and when it was
            sent."""
            job = inflight.pop(job_id, None)
            deadlines.pop(job_id, None)
            free[0] += slots.pop(job_id, 0)
            if job is not None and is_manifest(job.job):
                self._manifest_done(info.key)
            return job, sent.pop(job_id, None)

        async def watchdog() -> None:
            while True:
                await asyncio.sleep(1.0)
                now = loop.time()
                if any(d < now for d in deadlines.values()):
                    log.error("worker %s did not answer in time; dropping it", info.name)
                    writer.transport.abort()  # the read below fails; jobs are requeued
                    return

        feeder = asyncio.create_task(feed())
        dog = asyncio.create_task(watchdog())
        try:
            while True:
                result = Result.from_dict(await _read_frame(reader))
                job, sent_at = release(result.id)
                t1 = time.perf_counter()
                signing.observe(t1 - (t1 if sent_at is None else sent_at))
                freed.set()
                if job is not None and not job.future.done():
                    if result.object is not None:
                        job.future.set_result(Signed(result.object, info.name, job.attempts))
                    else:
                        # The worker judged the job itself bad: no other worker will do
                        # better.
                        job.future.set_exception(SigningFailed(str(result.error)))
                job = None  # (not held while the next answer is awaited: see feed)
        finally:
            for task in (feeder, dog):
                task.cancel()
            await asyncio.gather(feeder, dog, return_exceptions=True)


def socket_dispatcher(settings: Settings, stats: Stats | None = None, listen: bool = True
                      ) -> SocketDispatcher:
    """The host's dispatcher, as ``settings`` say: on ``stampd serve``'s socket
    (`Settings.serve_socket`), where it listens itself unless the host's coordinator does
    (``listen`` false)."""
    return SocketDispatcher(settings.serve_socket if listen else None,
                            max_queue=settings.max_queue,
                            sign_timeout=settings.sign_timeout,
                            max_attempts=settings.max_attempts, stats=stats)


MANIFEST_RATE = 1 << 20  # bytes per second a worker gets, on top of the signing timeout


def _extra_time(job: Job | RelayedJob) -> float:
    """Seconds a job may take beyond the signing timeout: a manifest's worker receives, checks
    and hashes it first (a 127 MiB one takes seconds, and with eight in flight on a 2-core
    host a worker was dropped for the 10 s timeout), one second per MiB of its lines."""
    return job.lines_size() / MANIFEST_RATE if isinstance(job, ManifestJob | RelayedJob) \
        else 0.0


async def _read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    size = frame_size(await reader.readexactly(HEADER.size))
    return decode_frame(await reader.readexactly(size))
