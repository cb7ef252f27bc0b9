"""The coordinator itself, in a thread of ``stampd serve`` (`server.coordinator`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from formats import gitobjects
from formats.jobs import CommitJob, MalformedMessage, RelayedJob, TagJob
from procs import memory
from server.budgets import HostBudgets, ManifestsBusy, RateLimited
from server.coordinator.wire import Call, Coalesced, Frame, Reply, read_frame
from server.dispatch import Signed
from server.dispatch.socket import SocketDispatcher
from server.errors import CommandFailed, JournalError, QueueFull, SigningFailed, StampError
from server.stamping.journal import Journal

log = logging.getLogger(__name__)

# The git objects a one-call stamp's job builds (`formats.jobs.GitJob`), by type.
GIT_OBJECTS = (TagJob.object_type, CommitJob.object_type)
# A deadline this close is due (the loop's timers are kept in milliseconds: one armed for a
# deadline could fire a fraction of one early, and be armed again for it at once).
DUE_WITHIN = 0.001


class _Deadlines:
    """The signing deadlines of one connection's ``stamp`` calls, with one timer armed at a
    time (at the earliest), not a timer a stamp: a loop timer set and cancelled costs 3-4 us
    of CPU, an entry here 0.5 us, of the ~90 us a stamp costs the coordinator's loop
    (`bench.coordinator`). A call whose job is not signed by its deadline has it cancelled
    (`done` says so)."""

    def __init__(self, jobs: dict[int, asyncio.Future[Signed]]) -> None:
        self._jobs = jobs
        self._loop = asyncio.get_running_loop()
        # By the seconds a call may wait (one value per HTTP process, its request timeout):
        # call id -> deadline, in the order added, so the deadlines of each only grow.
        self._by_wait: dict[float, dict[int, float]] = {}
        self._timer: asyncio.TimerHandle | None = None  # (armed at the earliest deadline)
        self._expired: set[int] = set()

    def add(self, cid: int, wait: float) -> None:
        deadline = self._loop.time() + wait
        self._by_wait.setdefault(wait, {})[cid] = deadline
        if self._timer is None or deadline < self._timer.when():
            self._arm(deadline)

    def done(self, cid: int, wait: float) -> bool:
        """Call ``cid``'s job is done (or cancelled): forget its deadline; whether it was
        cancelled for having passed it."""
        calls = self._by_wait.get(wait)
        if calls is not None:
            calls.pop(cid, None)
        if cid in self._expired:
            self._expired.discard(cid)
            return True
        return False

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, at: float) -> None:
        self.close()
        self._timer = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        due_by = self._loop.time() + DUE_WITHIN
        due: list[int] = []
        following = math.inf
        for wait, calls in list(self._by_wait.items()):
            passed: list[int] = []
            for cid, deadline in calls.items():
                if deadline > due_by:
                    following = min(following, deadline)
                    break
                passed.append(cid)
            for cid in passed:
                del calls[cid]
            due += passed
            if not calls:
                del self._by_wait[wait]
        if following < math.inf:
            self._arm(following)
        for cid in due:
            signing = self._jobs.get(cid)
            if signing is not None and not signing.done():
                self._expired.add(cid)
                signing.cancel()


class Coordinator:
    """The host's one `Journal` (when ``make_engine`` is given: SQLite), its `HostBudgets`
    and its one `SocketDispatcher` (when ``make_dispatcher`` is given: socket dispatch), in a
    thread with its own event loop, serving the HTTP processes on ``socket_path`` (0600) and
    the workers on the dispatcher's."""

    def __init__(self, socket_path: Path, make_engine: Callable[[], Engine] | None,
                 budgets: HostBudgets,
                 make_dispatcher: Callable[[], SocketDispatcher] | None = None) -> None:
        self.socket_path = socket_path
        self.make_engine = make_engine
        self.budgets = budgets
        self.make_dispatcher = make_dispatcher
        self.dispatcher: SocketDispatcher | None = None
        self.journal: Journal | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        # One task per connected process, and what it is sent.
        self._links: dict[asyncio.Task[None], Coalesced] = {}
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
        dispatcher = self.dispatcher = None if self.make_dispatcher is None \
            else self.make_dispatcher()
        if dispatcher is not None:
            dispatcher.on_workers = self._tell_workers
            await dispatcher.start()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = await asyncio.start_unix_server(self._accept, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            # (gone before the workers are hung up on: they know the server stopped)
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            for link in list(self._links):
                link.cancel()
            if self._links:
                await asyncio.wait(list(self._links), timeout=10)
            if dispatcher is not None:
                await dispatcher.stop()
            await server.wait_closed()
            if journal is not None:
                await journal.stop()
            if engine is not None:
                engine.dispose()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        """A worker (its first frame: `formats.jobs.Hello`) goes to the dispatcher, an HTTP
        process (a `Call`) is served here."""
        try:
            first = await asyncio.wait_for(read_frame(reader), 30)
        except (ValueError, ConnectionError, TimeoutError) as e:
            log.warning("coordinator: dropping a connection: %s", e)
            first = None
        if first is None:
            writer.close()
        elif "hello" in first[0] and self.dispatcher is not None:
            await self.dispatcher.serve_worker(reader, writer, first[0])
        else:
            await self._serve(reader, writer, first)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     frame: Frame | None) -> None:
        link = asyncio.current_task()
        assert link is not None
        out = self._links[link] = Coalesced(writer)
        waiting: set[asyncio.Future[Any]] = set()
        jobs: dict[int, asyncio.Future[Signed]] = {}  # its jobs with the dispatcher, by call
        recording: set[int] = set()  # its ``stamp`` calls whose rows are being committed
        deadlines = _Deadlines(jobs)  # of its ``stamp`` calls' jobs
        owner = id(link)  # (what the process holds in the budgets is under this name)
        try:
            while frame is not None:
                call = Call.decode(*frame)
                # Nothing here holds a frame once it is taken: a manifest's text (a view of
                # its frame) is the journal's until it is written. (The last frame of each
                # connection stayed until the next came: +141 MiB after a 105 MiB manifest.)
                del frame
                if call.op == "stamp":
                    self._stamp(call, out, jobs, waiting, recording, deadlines)
                elif call.op == "sign":
                    self._sign(call, out, jobs)
                elif call.op == "drop":
                    dropped = call.fields.get("c")
                    if isinstance(dropped, int):
                        recording.discard(dropped)  # (its row is committed, not signed)
                        if dropped in jobs:
                            jobs.pop(dropped).cancel()
                elif call.op == "hello":
                    if self.dispatcher is not None:  # (known before the hello is answered)
                        out.put(self._workers_news())
                    out.put(Reply(call.call_id).encode())
                elif call.op == "report":
                    record = call.fields.get("r")
                    if not isinstance(record, dict):
                        raise ValueError("a report without its record")
                    self._reports[owner] = (record, time.monotonic())
                elif call.op == "view":
                    now = time.monotonic()
                    d = self.dispatcher
                    out.put(Reply(call.call_id, view=[
                        {"record": r, "age": now - t} for r, t in self._reports.values()
                    ], host=None if d is None else {
                        "queue": d.queue_depth, "requeued": d.requeued,
                        "disconnects": d.stats.worker_disconnects}).encode())
                elif call.op == "published":
                    self._tell_all(call)
                elif call.op in ("charge", "take", "give"):
                    self._budget(call, owner, out)
                else:
                    self._take(call, out, waiting)
                del call
                frame = await read_frame(reader)
        except (ValueError, ConnectionError) as e:
            log.warning("coordinator: dropping a connection: %s", e)
        except asyncio.CancelledError:
            pass  # (stopping: the rows already sent are in the journal's queue)
        finally:
            deadlines.close()
            recording.clear()  # (rows committed from now on are not signed: left pending)
            for job in list(jobs.values()):  # (nobody waits for them: a worker signs none
                job.cancel()                 # of them that it has not been sent yet)
            self._reports.pop(owner, None)  # (it serves no more)
            self.budgets.in_flight.drop(owner)  # (its process is gone, or going)
            if waiting:  # what was asked is recorded before the connection goes
                await asyncio.wait(waiting, timeout=30)
            out.flush()
            writer.close()
            self._links.pop(link, None)

    def _tell_all(self, call: Call) -> None:
        """News from one HTTP process (the one writing the host's transparency log tiles) to
        every one of them: each wakes its proof waiters (`server.tlog.waiters`)."""
        size = call.fields.get("n")
        if not isinstance(size, int) or isinstance(size, bool):
            raise ValueError("news without a size")
        news = Reply(0, published=size).encode()
        for out in self._links.values():
            out.put(news)

    def _workers_news(self) -> bytes:
        assert self.dispatcher is not None
        return Reply(0, workers=[(w.name, w.key, w.pid)
                                 for w in self.dispatcher.workers.values()]).encode()

    def _tell_workers(self) -> None:
        """A worker came or went: every HTTP process hears which are connected now."""
        news = self._workers_news()
        for out in self._links.values():
            out.put(news)

    def _sign(self, call: Call, out: Coalesced, jobs: dict[int, asyncio.Future[Signed]]
              ) -> None:
        """Hand ``call``'s job to the host's dispatcher; the answer goes out when a worker
        gives it (no task per job, as for the journal's calls)."""
        cid, f = call.call_id, call.fields
        key, size, text, internal = f.get("k"), f.get("m"), call.text or b"", f.get("i", False)
        if not isinstance(key, str) or not isinstance(size, int) or not 0 < size <= len(text):
            raise ValueError("a sign call without its key or job")
        if not isinstance(internal, bool):
            raise ValueError("a sign call's internal flag is not a boolean")
        if self.dispatcher is None:
            out.put(Reply(cid, unsigned=("unavailable", "no dispatcher here")).encode())
            return
        try:
            fut = self.dispatcher.submit(RelayedJob(text[:size], text[size:]), key,
                                         internal=internal)
        except MalformedMessage as e:
            raise ValueError(f"a sign call's job: {e}") from None
        except QueueFull as e:
            out.put(Reply(cid, unsigned=("queue", e.message)).encode())
            return
        jobs[cid] = fut

        def done(fut: asyncio.Future[Signed]) -> None:
            jobs.pop(cid, None)
            if fut.cancelled():
                return  # (its caller gave up, or is gone)
            e = fut.exception()
            if e is None:
                r = fut.result()
                out.put(Reply(cid, signed=(r.text, r.worker, r.attempts)).encode())
            else:
                kind = "signing" if isinstance(e, SigningFailed) else "unavailable"
                out.put(Reply(cid, unsigned=(kind, str(e))).encode())

        fut.add_done_callback(done)

    def _stamp(self, call: Call, out: Coalesced, jobs: dict[int, asyncio.Future[Signed]],
               waiting: set[asyncio.Future[Any]], recording: set[int],
               deadlines: _Deadlines) -> None:
        """Record ``call``'s row; once it is committed, hand its job to the dispatcher, to be
        signed within the call's ``w`` seconds; a job that is not (refused, failed, timed
        out) has its failure committed before the answer goes out (`Stamper._failed`). A
        signed one is journalled signed here, with the id of the git object (``g``: its type
        and format) the signed text is, as the answer goes out. The answer carries the stamp
        id either way, and the seconds the row took to commit."""
        cid, f = call.call_id, call.fields
        row, key, size, wait, obj = f.get("row"), f.get("k"), f.get("m"), f.get("w"), f.get("g")
        text = call.text or b""
        if (not isinstance(row, dict) or not isinstance(key, str) or not isinstance(size, int)
                or not 0 < size <= len(text) or not isinstance(wait, (int, float))
                or isinstance(wait, bool) or not wait > 0):
            raise ValueError("a stamp call without its row, key, job or time")
        if (not isinstance(obj, list) or len(obj) != 2 or obj[0] not in GIT_OBJECTS
                or obj[1] not in gitobjects.OBJECT_FORMATS):
            raise ValueError("a stamp call without its git object's type and format")
        if self.journal is None or self.dispatcher is None:
            out.put(Reply(cid, error="journal unavailable: not kept here").encode())
            return
        try:
            job = RelayedJob(text[:size], text[size:])
        except MalformedMessage as e:
            raise ValueError(f"a stamp call's job: {e}") from None
        started = time.perf_counter()
        fut = self.journal.record_row_nowait(row, None)
        recording.add(cid)
        waiting.add(fut)

        def recorded(fut: asyncio.Future[Any]) -> None:
            waiting.discard(fut)
            wanted = cid in recording  # (not dropped, nor its process gone)
            recording.discard(cid)
            if fut.cancelled():
                if wanted:
                    out.put(Reply(cid, error="journal unavailable: stopping").encode())
            elif (e := fut.exception()) is not None:
                if wanted:
                    message = e.message if isinstance(e, JournalError) else "journal unavailable"
                    out.put(Reply(cid, error=message).encode())
            elif wanted:
                self._stamp_signed(cid, fut.result(), job, (obj[0], obj[1]), key, float(wait),
                                   time.perf_counter() - started, out, jobs, waiting, deadlines)

        fut.add_done_callback(recorded)

    def _stamp_signed(self, cid: int, sid: int, job: RelayedJob, obj: tuple[str, str],
                      key: str, wait: float, took: float, out: Coalesced,
                      jobs: dict[int, asyncio.Future[Signed]],
                      waiting: set[asyncio.Future[Any]], deadlines: _Deadlines) -> None:
        """The second half of `_stamp`: stamp ``sid`` is committed; its job to a worker, and
        its outcome to the journal (the signed text is the git object ``obj``, type and
        format, whose id is journalled)."""
        assert self.dispatcher is not None and self.journal is not None
        journal = self.journal
        try:
            signing = self.dispatcher.submit(job, key)
        except QueueFull as e:
            self._stamp_failed(cid, sid, "queue", e.message, e.message, took, out, waiting)
            return
        jobs[cid] = signing
        deadlines.add(cid, wait)

        def done(signing: asyncio.Future[Signed]) -> None:
            expired = deadlines.done(cid, wait)
            jobs.pop(cid, None)
            if signing.cancelled():
                if expired:
                    self._stamp_failed(cid, sid, "unavailable",
                                       "no worker could sign in time; retry later", "timed out",
                                       took, out, waiting)
                return  # (else its caller gave up, or is gone)
            e = signing.exception()
            if e is None:
                r = signing.result()
                try:
                    object_id = gitobjects.git_object_id(obj[0], r.text.encode("ascii"), obj[1])
                except UnicodeEncodeError:  # (no git object a worker builds)
                    self._stamp_failed(cid, sid, "signing", "malformed answer: not ASCII",
                                       "malformed answer: not ASCII", took, out, waiting)
                    return
                # (with the next group commit, not awaited, as `Stamper` journals a tag's
                # outcome: a stamp left pending is published all the same, `server.gitlog`)
                journal.signed(sid, r.worker, r.attempts, object_id)
                out.put(Reply(cid, sid, signed=(r.text, r.worker, r.attempts),
                              took=took).encode())
            elif isinstance(e, StampError):
                kind = "signing" if isinstance(e, SigningFailed) else "unavailable"
                self._stamp_failed(cid, sid, kind, e.message, e.message, took, out, waiting)
            else:
                self._stamp_failed(cid, sid, "unavailable", str(e),
                                   f"{type(e).__name__}: {e}", took, out, waiting)

        signing.add_done_callback(done)

    def _stamp_failed(self, cid: int, sid: int, kind: str, message: str, error: str,
                      took: float, out: Coalesced, waiting: set[asyncio.Future[Any]]) -> None:
        """Commit stamp ``sid``'s failure (``error``), then answer (``kind``, ``message``)."""
        assert self.journal is not None
        fut = self.journal.failed_durably_nowait(sid, error)
        waiting.add(fut)

        def done(fut: asyncio.Future[Any]) -> None:
            waiting.discard(fut)
            if not fut.cancelled() and fut.exception() is not None:
                log.warning("failure of stamp %d not recorded: %s", sid, fut.exception(),
                            extra={"stamp_id": sid})
            out.put(Reply(cid, sid, unsigned=(kind, message), took=took).encode())

        fut.add_done_callback(done)

    def _budget(self, call: Call, owner: int, out: Coalesced) -> None:
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

    def _take(self, call: Call, out: Coalesced, waiting: set[asyncio.Future[Any]]
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
