"""A worker signing one HTTP process's manifest tells the other processes' dispatchers (socket
dispatch, docs/jobs.md "Transports"): each takes back the jobs it had sent that worker, which
other workers then sign, and sends it none until it is free. Without it, a stamp handed to a
worker that had just taken another process's 127 MiB manifest waited behind it (a second and
more: `bench.manifest_flood --api-processes 3`, digest stamp max 1.5 s).

Both sides over real Unix sockets: the dispatcher (`SocketDispatcher`) with workers played by
the test, and the worker's connections (`workers.link.Dispatchers`) with dispatchers played by
the test."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from formats.jobs import (
    HEADER,
    Busy,
    FrameBuffer,
    Hello,
    ManifestJob,
    Paused,
    ReceiptJob,
    Result,
    decode_frame,
    frame_size,
    job_frame,
)
from formats.keys import PRIMARY
from server.dispatch.socket import SocketDispatcher
from tests.helpers import short_tmpdir
from workers.link import Dispatchers


@pytest.fixture
def run() -> Iterator[Path]:
    path = short_tmpdir("bw")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class FakeWorker:
    """A worker on the dispatcher's socket, driven by the test: it reads job frames and
    answers only when told."""

    def __init__(self, name: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.name, self.reader, self.writer = name, reader, writer

    @classmethod
    async def connect(cls, dispatcher: SocketDispatcher, name: str) -> FakeWorker:
        reader, writer = await asyncio.open_unix_connection(str(dispatcher.socket_path))
        writer.write(Hello(name, os.getpid(), "F" * 40, PRIMARY).frame())
        await writer.drain()
        while name not in dispatcher.workers:
            await asyncio.sleep(0.01)
        return cls(name, reader, writer)

    async def next_message(self) -> dict[str, Any]:
        head = await self.reader.readexactly(HEADER.size)
        return decode_frame(await self.reader.readexactly(frame_size(head)))

    async def say(self, frame: bytes) -> None:
        self.writer.write(frame)
        await self.writer.drain()

    async def answer_all(self) -> None:
        """Answer every job as it comes (a free worker)."""
        while True:
            message = await self.next_message()
            await self.say(Result(int(message["id"]), f"signed by {self.name}").frame())


def receipt(n: int) -> ReceiptJob:
    return ReceiptJob(f"statement {n}", 1_800_000_000)


def with_dispatcher(run: Path, scenario: Callable[[SocketDispatcher],
                                                  Coroutine[Any, Any, None]]) -> None:
    """``scenario`` against a started dispatcher (one attempt a job: a counted attempt of a
    job taken back would fail it), within 30 s; the dispatcher stopped after it."""
    async def main() -> None:
        dispatcher = SocketDispatcher(run / "dispatch-1.sock", sign_timeout=60, max_attempts=1)
        await dispatcher.start()
        try:
            async with asyncio.timeout(30):
                await scenario(dispatcher)
        finally:
            await dispatcher.stop()

    asyncio.run(main())


def test_a_busy_worker_gives_back_its_jobs_and_gets_none_until_it_is_free(run: Path) -> None:
    async def scenario(dispatcher: SocketDispatcher) -> None:
        busy = await FakeWorker.connect(dispatcher, "w:1:0")
        first = [asyncio.create_task(dispatcher.sign(receipt(i))) for i in range(2)]
        got = [await busy.next_message() for _ in first]  # in flight with it
        assert {m["text"] for m in got} == {"statement 0", "statement 1"}
        # Another process's manifest keeps it busy: the two go to another worker,
        # with one attempt each (max_attempts=1: a counted attempt would fail them).
        await busy.say(Busy(True).frame())
        assert Paused.is_one(await busy.next_message())
        free = await FakeWorker.connect(dispatcher, "w:2:0")
        answering = asyncio.create_task(free.answer_all())
        for task in first:
            signed = await task
            assert (signed.text, signed.attempts) == ("signed by w:2:0", 1)
        assert dispatcher.taken_back == 2
        # Nothing more for the busy one meanwhile: these too are signed by the other.
        more = await asyncio.gather(*(dispatcher.sign(receipt(i)) for i in range(2, 6)))
        assert {s.worker for s in more} == {"w:2:0"}
        # Free again, and the other one gone: the next job is the first one's.
        await busy.say(Busy(False).frame())
        answering.cancel()
        free.writer.close()
        while "w:2:0" in dispatcher.workers:
            await asyncio.sleep(0.01)
        later = asyncio.create_task(dispatcher.sign(receipt(6)))
        message = await busy.next_message()
        assert message["text"] == "statement 6"
        await busy.say(Result(int(message["id"]), "late").frame())
        assert (await later).worker == "w:1:0"
        busy.writer.close()

    with_dispatcher(run, scenario)


class FakeDispatcher:
    """A dispatcher's socket, played by the test: it accepts the worker's connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.conn: socket.socket | None = None
        self.frames = FrameBuffer()

    def accept(self) -> None:
        self.listener.settimeout(10)
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(10)
        assert "hello" in self.next_message()

    def next_message(self) -> dict[str, Any]:
        assert self.conn is not None
        while (message := self.frames.next()) is None:
            data = self.conn.recv(65536)
            assert data, "the worker hung up"
            self.frames.feed(data)
        return message

    def send(self, frame: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(frame)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()
        self.path.unlink(missing_ok=True)


Found = tuple[Path, list[dict[str, Any]]]


@pytest.fixture
def linked(run: Path) -> Iterator[tuple[FakeDispatcher, FakeDispatcher, Dispatchers]]:
    """A worker's connections to two dispatchers played by the test, ``a`` and ``b``, both
    accepted."""
    a, b = FakeDispatcher(run / "dispatch.sock"), FakeDispatcher(run / "dispatch-1.sock")
    links = Dispatchers((a.path, b.path), Hello("w:1:0", os.getpid(), "F" * 40,
                                                PRIMARY).frame(), "w:1:0")
    try:
        links.connect(deadline=0)
        a.accept()
        b.accept()
        yield a, b, links
    finally:
        links.close()
        a.close()
        b.close()


def turns(links: Dispatchers, until: Callable[[Found | None], bool]) -> Found | None:
    """Turns of the worker's loop (each reads what one socket has, waiting 0.05 s at most)
    until ``until`` holds of what one returned: that; 100 turns at most."""
    for _ in range(100):
        found = links.next_jobs(0.05)
        if until(found):
            return found
    raise AssertionError("not within 100 turns of the worker's loop")


def test_a_worker_tells_the_other_dispatchers_and_drops_what_they_took_back(
        linked: tuple[FakeDispatcher, FakeDispatcher, Dispatchers]) -> None:
    a, b, links = linked
    b.send(job_frame(1, receipt(1)))  # sent before b hears the worker is busy
    links.busy_for(a.path)  # (a manifest of a's)
    links.busy_for(a.path)  # (said once)
    assert b.next_message() == {"busy": True}
    b.send(job_frame(2, receipt(2)) + Paused().frame() + job_frame(3, receipt(3)))
    links.free()
    assert b.next_message() == {"busy": False}
    # Jobs 1 and 2 came before b's Paused: b took them back, and they are dropped here.
    found = turns(links, lambda found: found is not None)
    assert found is not None
    path, messages = found
    assert path == b.path and [m["id"] for m in messages] == [3]
    assert not links.dropping and not links.told
    # a was not told: it sent the manifest.
    a.send(job_frame(4, receipt(4)))
    found = links.next_jobs(5.0)
    assert found is not None and found[0] == a.path and found[1][0]["id"] == 4


def test_the_others_hear_it_when_a_manifests_head_comes_and_again_if_it_never_ends(
        linked: tuple[FakeDispatcher, FakeDispatcher, Dispatchers]) -> None:
    a, b, links = linked
    lines = "".join(f"{i:064x}  f{i}\n" for i in range(1000))
    frame = job_frame(1, ManifestJob("sha256", 1, "u", 1, "F" * 40, lines))

    def quiet_until_busy(found: Found | None) -> bool:
        assert found is None  # (the lines are not all in)
        return links.busy_with == a.path

    a.send(frame[:-100])  # the head and most of the lines
    turns(links, quiet_until_busy)  # (until the worker has read what was sent)
    assert b.next_message() == {"busy": True}  # before the lines are all in
    a.send(frame[-100:])
    found = links.next_jobs(5.0)
    assert found is not None and found[0] == a.path and found[1][0]["lines"] == lines
    links.free()
    assert b.next_message() == {"busy": False}
    b.send(Paused().frame())
    # A manifest whose dispatcher hangs up before its lines are in: the others may send again.
    a.send(frame[:-100])
    turns(links, quiet_until_busy)
    assert b.next_message() == {"busy": True}
    assert a.conn is not None
    a.conn.close()
    turns(links, lambda _: a.path not in links.links)
    assert b.next_message() == {"busy": False} and links.busy_with is None


def test_a_dispatcher_that_comes_back_while_the_worker_is_busy_is_told(
        linked: tuple[FakeDispatcher, FakeDispatcher, Dispatchers]) -> None:
    a, b, links = linked
    links.busy_for(a.path)
    assert b.next_message() == {"busy": True}
    links.drop(b.path, "test")  # (its HTTP process restarted)
    b.close()
    again = FakeDispatcher(b.path)
    try:
        links.lost[b.path] = 0.0
        links.next_jobs(0.05)  # tries it again
        again.accept()
        assert again.next_message() == {"busy": True}
        links.free()
        assert again.next_message() == {"busy": False}
    finally:
        again.close()


def test_a_worker_busy_elsewhere_counts_among_its_keys_manifest_signers(run: Path) -> None:
    """Of a key's two workers, one busy with another process's manifest: this dispatcher's
    own manifest waits (one worker stays free for stamps) until that one is free, or gone."""
    lines = "".join(f"{i:064x}  f{i}\n" for i in range(100))

    async def scenario(dispatcher: SocketDispatcher) -> None:
        busy = await FakeWorker.connect(dispatcher, "w:1:0")
        free = await FakeWorker.connect(dispatcher, "w:2:0")
        await busy.say(Busy(True).frame())
        assert Paused.is_one(await busy.next_message())
        manifest = asyncio.create_task(dispatcher.sign(
            ManifestJob("sha256", 1, "u", 1, "F" * 40, lines)))
        # Held back: a stamp still goes to the free worker, and is all it gets.
        stamp = asyncio.create_task(dispatcher.sign(receipt(1)))
        message = await free.next_message()
        assert message["op"] == "receipt"
        await free.say(Result(int(message["id"]), "stamp").frame())
        assert (await stamp).worker == "w:2:0" and not manifest.done()
        # The busy one is gone (killed while signing): the manifest goes out.
        busy.writer.close()
        message = await free.next_message()
        assert message["op"] == "manifest"
        await free.reader.readexactly(int(message["lines_bytes"]))
        await free.say(Result(int(message["id"]), "manifest").frame())
        assert (await manifest).text == "manifest"
        free.writer.close()

    with_dispatcher(run, scenario)
