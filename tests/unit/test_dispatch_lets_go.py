"""The socket dispatcher keeps no job once it is answered (server/dispatch/socket.py): the loop
that feeds a worker held the last job it sent while it waited for the next, and the loop that
reads a worker's answers held the last job answered, so a manifest's lines (127 MiB) stayed
alive until that worker's next job (a server left idle after two manifests: 250 MiB more)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

from formats.jobs import HEADER, Hello, ManifestJob, Result, decode_frame, frame_size
from server.dispatch.socket import SocketDispatcher
from tests.helpers import short_tmpdir
from workers.keys.keyset import PRIMARY


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
