"""The host's one dispatcher, in the coordinator (socket dispatch, several HTTP processes): every
worker connects once, to it, on the socket where each HTTP process hands it its jobs over its
one connection to the coordinator (`HostDispatcher`) and gets their answers back. Real Unix
sockets, the coordinator in its own thread; the workers are played by the test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from formats.frames import HEADER, decode_frame, frame_size
from formats.gitobjects import git_object_id
from formats.jobs import Hello, ManifestJob, NoteJob, ReceiptJob, Result
from formats.keys import PRIMARY, ServedKey
from server import db
from server.budgets import HostBudgets
from server.coordinator import Coordinator, CoordinatorLink, HostDispatcher
from server.coordinator.host import _Deadlines
from server.coordinator.wire import Call
from server.dispatch import Signed
from server.dispatch.socket import SocketDispatcher
from server.errors import MalformedAnswer, QueueFull, SigningFailed, StampError, Unavailable
from server.models import Stamp, StampState
from server.settings import Settings
from server.stamping.journal import stamp_row
from server.stamping.requests import BranchRequest, DigestRequest, TagRequest
from server.stamping.stamper import Stamper
from tests.helpers import migrated_sqlite, short_tmpdir


class FakeWorker:
    """A worker on the host's dispatcher socket, driven by the test."""

    def __init__(self, name: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.name, self.reader, self.writer = name, reader, writer

    @classmethod
    async def connect(cls, path: Path, name: str, key: str = PRIMARY) -> FakeWorker:
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(Hello(name, os.getpid(), "F" * 40, key).frame())
        await writer.drain()
        return cls(name, reader, writer)

    async def next_job(self) -> tuple[dict[str, Any], bytes]:
        """The next job's object, and the lines that follow a manifest's."""
        message = decode_frame(await self.reader.readexactly(
            frame_size(await self.reader.readexactly(HEADER.size))))
        lines = b""
        if "lines_bytes" in message:
            lines = await self.reader.readexactly(int(message["lines_bytes"]))
        return message, lines

    async def answer(self, job_id: int, text: str | None = None, error: str | None = None
                     ) -> None:
        self.writer.write(Result(job_id, text, error).frame())
        await self.writer.drain()


@pytest.fixture
def run() -> Iterator[Path]:
    path = short_tmpdir("hd")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def with_host(run: Path, scenario: Callable[[Coordinator], Coroutine[Any, Any, None]],
              max_queue: int = 100, make_engine: Callable[[], Engine] | None = None) -> None:
    """``scenario`` against a started coordinator running the host's dispatcher (and the
    journal on ``make_engine``'s database, if given), within 30 s; the coordinator stopped
    after it."""
    host = Coordinator(run / "serve.sock", make_engine,
                       HostBudgets(Settings(data_dir=run), lambda: 0.0),
                       lambda: SocketDispatcher(None, max_queue=max_queue,
                                                sign_timeout=60, max_attempts=1))
    host.start()

    async def main() -> None:
        async with asyncio.timeout(30):
            await scenario(host)

    try:
        asyncio.run(main())
    finally:
        host.stop()


async def linked(host: Coordinator) -> tuple[CoordinatorLink, HostDispatcher]:
    link = CoordinatorLink(host.socket_path)
    await link.connect()
    return link, HostDispatcher(link)


async def until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.01)


def receipt(n: int) -> ReceiptJob:
    return ReceiptJob(f"statement {n}", 1_800_000_000)


def test_every_http_process_gets_its_jobs_signed_by_the_hosts_workers(run: Path) -> None:
    async def scenario(host: Coordinator) -> None:
        (a, da), (b, db) = await linked(host), await linked(host)
        assert da.workers == {} and da.keys_served() == set()
        worker = await FakeWorker.connect(host.socket_path, "w:1:0")
        # Every process hears of the worker (and of its going, below).
        await until(lambda: "w:1:0" in da.workers and "w:1:0" in db.workers)
        assert da.keys_served() == {PRIMARY} and da.workers["w:1:0"].pid == os.getpid()

        jobs = [asyncio.create_task(d.sign(receipt(i))) for i, d in enumerate((da, db))]
        seen = {}
        for _ in jobs:  # (one worker, one dispatcher: both jobs reach it)
            message, _ = await worker.next_job()
            seen[message["text"]] = message["id"]
        assert sorted(seen) == ["statement 0", "statement 1"]
        await worker.answer(seen["statement 1"], "signed 1")
        await worker.answer(seen["statement 0"], "signed 0")
        assert [(s.text, s.worker, s.attempts) for s in await asyncio.gather(*jobs)] == \
            [("signed 0", "w:1:0", 1), ("signed 1", "w:1:0", 1)]

        # A worker's refusal of a job is the caller's `SigningFailed`.
        refused = asyncio.create_task(da.sign(receipt(2)))
        message, _ = await worker.next_job()
        await worker.answer(message["id"], error="malformed job: no")
        with pytest.raises(SigningFailed, match="malformed job: no"):
            await refused

        worker.writer.close()
        await until(lambda: not da.workers and not db.workers)
        await a.stop()
        await b.stop()

    with_host(run, scenario)


def test_answers_written_together_each_reach_their_caller_and_half_an_answer_is_none(
        run: Path) -> None:
    """A worker answers the jobs it signed together in one write (`workers.loop.serve`): the
    dispatcher takes every answer of that write, each to its caller, in whatever order; one
    answered by half when the worker goes is no answer (its job fails: one attempt here)."""
    async def scenario(host: Coordinator) -> None:
        link, d = await linked(host)
        worker = await FakeWorker.connect(host.socket_path, "w:1:0")
        await until(lambda: "w:1:0" in d.workers)
        jobs = [asyncio.create_task(d.sign(receipt(i))) for i in range(3)]
        ids = {}
        for _ in jobs:
            message, _ = await worker.next_job()
            ids[message["text"]] = message["id"]
        worker.writer.write(b"".join(Result(ids[f"statement {i}"], f"signed {i}").frame()
                                     for i in (2, 0, 1)))
        await worker.writer.drain()
        assert [s.text for s in await asyncio.gather(*jobs)] == ["signed 0", "signed 1",
                                                                  "signed 2"]
        cut = asyncio.create_task(d.sign(receipt(3)))
        message, _ = await worker.next_job()
        whole = Result(message["id"], "signed 3").frame()
        worker.writer.write(whole[:len(whole) // 2])
        await worker.writer.drain()
        worker.writer.close()
        with pytest.raises(SigningFailed, match="signing failed 1 times"):
            await cut
        await until(lambda: not d.workers)
        await link.stop()

    with_host(run, scenario)


def test_a_manifest_reaches_its_worker_byte_for_byte(run: Path) -> None:
    lines = "".join(f"{i:064x}  f\u00e9{i}\n" for i in range(40_000))  # ~2.9 MB: a long frame

    async def scenario(host: Coordinator) -> None:
        a, da = await linked(host)
        worker = await FakeWorker.connect(host.socket_path, "w:1:0")
        job = ManifestJob("sha256", 1, "u", 1, "F" * 40, lines.encode())
        signing = asyncio.create_task(da.sign(job))
        message, got = await worker.next_job()
        assert message["op"] == "manifest" and got == lines.encode()
        await worker.answer(message["id"], "signed")
        assert (await signing).text == "signed"
        # A stamp after it goes the same way (the link's frames stayed whole).
        stamp = asyncio.create_task(da.sign(receipt(1)))
        message, _ = await worker.next_job()
        await worker.answer(message["id"], "stamp")
        assert (await stamp).text == "stamp"
        await a.stop()

    with_host(run, scenario)


def test_a_job_whose_caller_gives_up_or_goes_is_never_sent(run: Path) -> None:
    async def scenario(host: Coordinator) -> None:
        (a, da), (b, db) = await linked(host), await linked(host)
        given_up = asyncio.create_task(da.sign(receipt(1)))
        orphaned = asyncio.create_task(db.sign(receipt(2)))
        await until(lambda: host.dispatcher is not None and host.dispatcher.queue_depth == 2)
        given_up.cancel()
        await b.stop()  # (its process died: the coordinator forgets its jobs)
        with pytest.raises(Unavailable):  # (its link stopped)
            await orphaned
        # Both are done with in the coordinator (none waits for an answer any more).
        await until(lambda: host.dispatcher is not None and host.dispatcher._outstanding == 0)
        # Only a job asked for now reaches the worker that comes.
        kept = asyncio.create_task(da.sign(receipt(3)))
        worker = await FakeWorker.connect(host.socket_path, "w:1:0")
        message, _ = await worker.next_job()
        assert message["text"] == "statement 3"
        await worker.answer(message["id"], "signed")
        assert (await kept).text == "signed"
        assert host.dispatcher is not None and host.dispatcher.queue_depth == 0
        await a.stop()

    with_host(run, scenario)


async def fill_the_queue(host: Coordinator, d: HostDispatcher, size: int
                         ) -> list[asyncio.Task[Signed]]:
    """``size`` clients' jobs waiting in the host's queue (bounded at ``size``, no worker yet),
    which then refuses the next."""
    waiting = [asyncio.create_task(d.sign(receipt(i))) for i in range(size)]
    await until(lambda: host.dispatcher is not None and host.dispatcher.queue_depth == size)
    with pytest.raises(QueueFull):
        await d.sign(receipt(size + 1))
    return waiting


def test_the_hosts_queue_is_bounded_and_its_figures_reach_every_process(run: Path) -> None:
    async def scenario(host: Coordinator) -> None:
        a, da = await linked(host)
        waiting = await fill_the_queue(host, da, 2)
        await a.view()
        assert a.host["queue"] == 2
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await a.stop()

    with_host(run, scenario, max_queue=2)


def test_the_services_own_jobs_pass_a_full_queue_and_go_ahead_of_clients_jobs(
        run: Path) -> None:
    """Under overload the transparency log's checkpoint (an internal job) is neither refused
    by the queue's bound nor kept behind the clients' jobs: the proofs of stamps signed
    before go on being published."""
    async def scenario(host: Coordinator) -> None:
        a, da = await linked(host)
        waiting = await fill_the_queue(host, da, 2)
        checkpoint = asyncio.create_task(da.sign(NoteJob("origin\n3\nroot\n"),
                                                 internal=True))
        await until(lambda: host.dispatcher is not None and host.dispatcher.queue_depth == 3)
        with pytest.raises(QueueFull):  # (the bound still holds for clients)
            await da.sign(receipt(4))
        worker = await FakeWorker.connect(host.socket_path, "w:1:0")
        first, _ = await worker.next_job()
        assert first["op"] == "note" and first["text"] == "origin\n3\nroot\n"
        await worker.answer(first["id"], "c2lnbmF0dXJl")
        assert (await checkpoint).text == "c2lnbmF0dXJl"
        for _ in waiting:  # (the clients' jobs, in the order they came)
            job, _ = await worker.next_job()
            await worker.answer(job["id"], f"signed {job['text']}")
        assert [t.text for t in await asyncio.gather(*waiting)] == [
            "signed statement 0", "signed statement 1"]
        await a.stop()

    with_host(run, scenario, max_queue=2)


# -- a tag or branch stamp: one call records its row and has its job signed (`RecordAndSign`) --

TAG_KEY = ServedKey(PRIMARY, "openpgp", "F" * 40, "eddsa (ed25519)", "pub", "T <t@x>",
                    primary=True)
NOW = 1_795_400_000.0


def with_journal(run: Path, tmp_path: Path,
                 scenario: Callable[[Coordinator, Callable[[], list[Any]]],
                                    Coroutine[Any, Any, None]],
                 max_queue: int = 100) -> list[Any]:
    """``scenario`` against a coordinator keeping the host's journal (SQLite) and its
    dispatcher, with a reader of the journal's rows (state, error, worker, object id) as
    committed; the rows once the coordinator stopped."""
    url = migrated_sqlite(tmp_path / "journal.sqlite3")
    engine = db.make_engine(url)

    def rows() -> list[Any]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(
                select(Stamp.state, Stamp.error, Stamp.worker, Stamp.object_id)
                .order_by(Stamp.id))]

    try:
        with_host(run, lambda host: scenario(host, rows), max_queue,
                  lambda: db.make_engine(url))
        return rows()
    finally:
        engine.dispose()


async def stamper_of(host: Coordinator, request_timeout: float = 20.0
                     ) -> tuple[CoordinatorLink, Stamper]:
    """A link to ``host``, and a stamper as an HTTP process of a host on SQLite has it:
    journal and dispatcher both the coordinator's, over that link."""
    link = CoordinatorLink(host.socket_path)
    await link.connect()
    return link, Stamper(link, HostDispatcher(link), [TAG_KEY],
                         public_url="http://stampd.invalid/", request_timeout=request_timeout,
                         clock=lambda: NOW, at_once=link)


def spy_ops(link: CoordinatorLink) -> list[str]:
    """The ops of the calls ``link`` makes from now on, those that want a reply and those
    that do not (an outcome)."""
    ops: list[str] = []
    call, tell = link._call, link._tell

    async def spied(op: str, *args: Any, **kwargs: Any) -> Any:
        ops.append(op)
        return await call(op, *args, **kwargs)

    def told(op: str, fields: dict[str, Any]) -> bool:
        ops.append(op)
        return tell(op, fields)

    link._call = spied  # type: ignore[method-assign]
    link._tell = told  # type: ignore[method-assign]
    return ops


def test_a_tag_stamp_is_one_call_its_row_committed_before_its_job_goes(
        run: Path, tmp_path: Path) -> None:
    async def scenario(host: Coordinator, rows: Callable[[], list[Any]]) -> None:
        link, stamper = await stamper_of(host)
        worker = await FakeWorker.connect(host.socket_path, "w:1:0")
        await until(lambda: "w:1:0" in link.workers)
        ops = spy_ops(link)
        stamping = asyncio.create_task(stamper.stamp(TagRequest("a" * 40, "v1")))
        message, _ = await worker.next_job()
        assert rows() == [(StampState.PENDING, None, None, None)]  # committed before it went
        assert message["op"] == "tag" and message["commit"] == "a" * 40
        await worker.answer(message["id"], "object signed\n")
        assert await stamping == "object signed\n"
        # A branch stamp goes the same way; a digest stamp (its statement names its serial)
        # records first, then signs.
        branch = asyncio.create_task(stamper.stamp(BranchRequest("b" * 40, "c" * 40)))
        message, _ = await worker.next_job()
        await worker.answer(message["id"], "commit signed\n")
        await branch
        digest = asyncio.create_task(stamper.stamp(DigestRequest("sha256", "d" * 64)))
        message, _ = await worker.next_job()
        assert message["op"] == "receipt" and "\nserial: 3\n" in message["text"]
        await worker.answer(message["id"], "receipt signed\n")
        with contextlib.suppress(MalformedAnswer):  # (the fake's answer is no receipt)
            await digest
        # The tag's and the branch's outcomes were journalled by the host: no ``signed``
        # call for them (the last call is the digest's, its signed text stored with it).
        assert ops == ["stamp", "stamp", "record", "sign", "signed"]
        await link.stop()

    rows = with_journal(run, tmp_path, scenario)
    assert rows[:2] == [
        (StampState.SIGNED, None, "w:1:0", git_object_id("tag", b"object signed\n")),
        (StampState.SIGNED, None, "w:1:0", git_object_id("commit", b"commit signed\n"))]


@pytest.mark.parametrize("fields", [{"g": ["blob", "sha1"]}, {"g": ["tag", "md5"]}, {"g": "tag"},
                                    {"g": None}, {"w": 0}, {"m": 99}])
def test_a_malformed_stamp_call_loses_its_connection_and_records_nothing(
        run: Path, tmp_path: Path, fields: dict[str, Any]) -> None:
    """A ``stamp`` call whose git object (``g``: its type and format), time, or job is not one
    the host can journal is a broken HTTP process: its connection is dropped, nothing is
    committed, and the other processes are served on."""
    async def scenario(host: Coordinator, rows: Callable[[], list[Any]]) -> None:
        link, stamper = await stamper_of(host)
        reader, writer = await asyncio.open_unix_connection(str(host.socket_path))
        call = {"row": stamp_row(TagRequest("a" * 40, "v1"), int(NOW)), "k": PRIMARY, "m": 3,
                "w": 5.0, "g": ["tag", "sha1"], **fields}
        writer.write(Call("stamp", 1, call, text=b"job").encode())
        assert await reader.read() == b""  # (dropped, unanswered)
        writer.close()
        worker = await FakeWorker.connect(host.socket_path, "w:1:0")
        stamping = asyncio.create_task(stamper.stamp(TagRequest("b" * 40, "v2")))
        message, _ = await worker.next_job()
        await worker.answer(message["id"], "signed\n")
        await stamping
        await link.stop()

    rows = with_journal(run, tmp_path, scenario)
    assert rows == [(StampState.SIGNED, None, "w:1:0", git_object_id("tag", b"signed\n"))]


@pytest.mark.parametrize("fault", ["no worker in time", "queue full", "refused"])
def test_a_tag_stamp_not_signed_has_its_failure_committed_before_the_answer(
        run: Path, tmp_path: Path, fault: str) -> None:
    caught: list[BaseException] = []
    committed: list[Any] = []

    async def scenario(host: Coordinator, rows: Callable[[], list[Any]]) -> None:
        link, stamper = await stamper_of(
            host, request_timeout=0.2 if fault == "no worker in time" else 20)
        waiting = None
        if fault == "queue full":  # (a stamp waits for a worker, and fills the queue)
            waiting = asyncio.create_task(stamper.stamp(TagRequest("1" * 40, "v0")))
            await until(lambda: host.dispatcher is not None
                        and host.dispatcher.queue_depth == 1)
        stamping = asyncio.create_task(stamper.stamp(TagRequest("a" * 40, "v1")))
        if fault == "refused":
            worker = await FakeWorker.connect(host.socket_path, "w:1:0")
            message, _ = await worker.next_job()
            await worker.answer(message["id"], error="malformed job: no")
        try:
            await stamping
        except StampError as e:
            committed.extend(rows())  # (read before anything else could commit)
            caught.append(e)
        if waiting is not None:
            waiting.cancel()
        await link.stop()

    with_journal(run, tmp_path, scenario, max_queue=1)
    (e,) = caught
    failed = committed[-1]
    assert failed[0] == StampState.FAILED
    if fault == "no worker in time":
        assert isinstance(e, Unavailable) and failed[1] == "timed out"
    elif fault == "queue full":
        assert isinstance(e, QueueFull) and failed[1] == e.message
    else:
        assert isinstance(e, SigningFailed) and "malformed job: no" in (failed[1] or "")


def test_a_tag_stamp_whose_caller_gives_up_is_recorded_and_never_signed(
        run: Path, tmp_path: Path) -> None:
    async def scenario(host: Coordinator, rows: Callable[[], list[Any]]) -> None:
        link, stamper = await stamper_of(host)
        given_up = asyncio.create_task(stamper.stamp(TagRequest("a" * 40, "v1")))
        await until(lambda: host.dispatcher is not None and host.dispatcher.queue_depth == 1)
        given_up.cancel()
        await until(lambda: host.dispatcher is not None and host.dispatcher._outstanding == 0)
        kept = asyncio.create_task(stamper.stamp(TagRequest("b" * 40, "v2")))
        worker = await FakeWorker.connect(host.socket_path, "w:1:0")
        message, _ = await worker.next_job()
        assert message["commit"] == "b" * 40  # (the job given up on never went out)
        await worker.answer(message["id"], "signed\n")
        await kept
        await link.stop()

    rows = with_journal(run, tmp_path, scenario)
    # The row given up on stays pending: the log committer publishes it after the request
    # timeout, as it does a row whose process died (its signature may have gone out).
    assert rows == [(StampState.PENDING, None, None, None),
                    (StampState.SIGNED, None, "w:1:0", git_object_id("tag", b"signed\n"))]


# -- the stamps' signing deadlines: one timer a connection (`_Deadlines`) ---------------------

def test_a_deadline_expires_its_job_alone_whatever_the_order_of_the_others() -> None:
    """A job past its deadline is cancelled and said to have expired; one done before is not;
    a shorter deadline added after a longer one is not held behind it (one timer is armed
    at a time, at the earliest deadline); jobs of the longer one stay."""
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        futures = {cid: loop.create_future() for cid in (1, 2, 3, 4)}
        jobs: dict[int, asyncio.Future[Any]] = dict(futures)
        deadlines = _Deadlines(jobs)
        try:
            deadlines.add(1, 3600.0)
            deadlines.add(2, 0.05)
            deadlines.add(3, 0.05)
            deadlines.add(4, 0.2)
            futures[3].set_result("signed")
            assert deadlines.done(3, 0.05) is False  # (done in time)
            async with asyncio.timeout(20):  # (not the hour of job 1)
                while not (futures[2].cancelled() and futures[4].cancelled()):
                    await asyncio.sleep(0.01)
            assert deadlines.done(2, 0.05) is True and deadlines.done(4, 0.2) is True
            assert not futures[1].done()
            futures[1].cancel()  # (cancelled by its caller, not expired)
            assert deadlines.done(1, 3600.0) is False
        finally:
            deadlines.close()

    asyncio.run(scenario())
