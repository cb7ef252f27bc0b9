"""The socket dispatcher keeps no job once it is answered (server/dispatch/socket.py): the loop
that feeds a worker held the last job it sent while it waited for the next, and the loop that
reads a worker's answers held the last job answered, so a manifest's lines (127 MiB) stayed
alive until that worker's next job (a server left idle after two manifests: 250 MiB more)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import threading
from pathlib import Path

import uvloop

from formats.frames import HEADER, decode_frame, frame_size
from formats.jobs import Hello, ManifestJob, Result
from formats.keys import PRIMARY
from formats.manifests import PIECE
from server.dispatch.socket import SocketDispatcher
from tests.helpers import short_tmpdir


async def _fake_worker(sock: Path, dispatcher: SocketDispatcher
                       ) -> tuple[asyncio.StreamWriter, asyncio.Task[None]]:
    """A worker that says hello, then answers each manifest job with a fixed signature."""
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(Hello("fake:1:0", os.getpid(), "F" * 40, PRIMARY).frame())
    await writer.drain()

    async def serve() -> None:
        while True:
            head = await reader.readexactly(HEADER.size)
            message = decode_frame(await reader.readexactly(frame_size(head, 1 << 30)))
            await reader.readexactly(int(message.get("lines_bytes", 0)))
            writer.write(Result(int(message["id"]), "SIGNATURE").frame())
            await writer.drain()

    task = asyncio.create_task(serve())
    async with asyncio.timeout(10):
        while PRIMARY not in dispatcher.keys_served():
            await asyncio.sleep(0.01)
    return writer, task


def test_an_answered_manifest_job_is_not_held() -> None:
    run = short_tmpdir("dl")
    lines = "".join(f"{i:064x}  f{i}\n" for i in range(20_000))  # (a string of its own)

    async def scenario() -> tuple[int, int]:
        sock = run / "dispatch.sock"
        dispatcher = SocketDispatcher(sock, sign_timeout=60, max_attempts=1)
        await dispatcher.start()
        worker, served = await _fake_worker(sock, dispatcher)
        try:
            before = sys.getrefcount(lines)
            signed = await dispatcher.sign(
                ManifestJob("sha256", 1, "u", 1, "F" * 40, lines), PRIMARY)
            assert signed.text == "SIGNATURE"
            for _ in range(10):  # (the loops go back to waiting)
                await asyncio.sleep(0)
            return before, sys.getrefcount(lines)
        finally:
            served.cancel()
            worker.close()
            await dispatcher.stop()

    try:
        before, after = asyncio.run(scenario())
    finally:
        shutil.rmtree(run, ignore_errors=True)
    assert after == before, f"{after - before} reference(s) to the lines left"


def _reading_worker(sock: Path) -> socket.socket:
    """A worker in a thread of its own, reading each job as fast as it comes (as a worker
    process does), answering each with a fixed signature."""
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(str(sock))
    conn.sendall(Hello("fake:2:0", os.getpid(), "F" * 40, PRIMARY).frame())

    def exactly(n: int) -> bytes:
        got = bytearray()
        while len(got) < n:
            chunk = conn.recv(min(n - len(got), 1 << 20))
            if not chunk:
                raise EOFError
            got += chunk
        return bytes(got)

    def serve() -> None:
        with contextlib.suppress(OSError, EOFError):
            while True:
                message = decode_frame(exactly(frame_size(exactly(HEADER.size), 1 << 30)))
                exactly(int(message.get("lines_bytes", 0)))
                conn.sendall(Result(int(message["id"]), "SIGNATURE").frame())

    threading.Thread(target=serve, daemon=True).start()
    return conn


def test_a_manifest_goes_to_its_worker_a_loop_turn_per_piece() -> None:
    """Each piece of a manifest sent to a worker has a turn of the event loop of its own: a
    task ticking beside the send ticks at least once per piece. (In a loaded server the
    pieces were seen going out in one callback that held the loop 90-120 ms, ``drain()`` not
    waiting; this harness, a worker reading in a thread on uvloop, has not reproduced that
    without the dispatcher's own turn per piece: it holds the property, whichever keeps it.)"""
    run = short_tmpdir("dl")
    lines = "".join(f"{i:064x}  f{i}\n" for i in range(100_000))  # ~7.5 MiB: 7+ pieces
    pieces = -(-len(lines) // PIECE)

    async def scenario() -> int:
        sock = run / "dispatch.sock"
        dispatcher = SocketDispatcher(sock, sign_timeout=60, max_attempts=1)
        await dispatcher.start()
        worker = _reading_worker(sock)
        async with asyncio.timeout(10):
            while PRIMARY not in dispatcher.keys_served():
                await asyncio.sleep(0.01)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            await asyncio.sleep(0)
            before = ticks
            signed = await dispatcher.sign(
                ManifestJob("sha256", 1, "u", 1, "F" * 40, lines), PRIMARY)
            assert signed.text == "SIGNATURE"
            return ticks - before
        finally:
            ticker.cancel()
            worker.close()
            await dispatcher.stop()

    try:
        ticks = uvloop.run(scenario())
    finally:
        shutil.rmtree(run, ignore_errors=True)
    assert ticks >= pieces, f"{ticks} turns of the loop for {pieces} pieces"
