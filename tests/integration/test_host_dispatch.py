"""The host's one dispatcher, in the coordinator (socket dispatch, several HTTP processes): every
worker connects once, to it, on the socket where each HTTP process hands it its jobs over its
one connection to the coordinator (`HostDispatcher`) and gets their answers back. Real Unix
sockets, the coordinator in its own thread; the workers are played by the test."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from formats.jobs import (
    HEADER,
    Hello,
    ManifestJob,
    ReceiptJob,
    Result,
    decode_frame,
    frame_size,
)
from formats.keys import PRIMARY
from server.budgets import HostBudgets
from server.coordinator import Coordinator, CoordinatorLink, HostDispatcher
from server.dispatch.socket import SocketDispatcher
from server.errors import QueueFull, SigningFailed, Unavailable
from server.settings import Settings
from tests.helpers import short_tmpdir


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
              max_queue: int = 100) -> None:
    """``scenario`` against a started coordinator running the host's dispatcher (no journal),
    within 30 s; the coordinator stopped after it."""
    host = Coordinator(run / "serve.sock", None,
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


def test_the_hosts_queue_is_bounded_and_its_figures_reach_every_process(run: Path) -> None:
    async def scenario(host: Coordinator) -> None:
        a, da = await linked(host)
        waiting = [asyncio.create_task(da.sign(receipt(i))) for i in range(2)]
        await until(lambda: host.dispatcher is not None and host.dispatcher.queue_depth == 2)
        with pytest.raises(QueueFull):
            await da.sign(receipt(3))
        await a.view()
        assert a.host["queue"] == 2
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await a.stop()

    with_host(run, scenario, max_queue=2)
