"""The HTTP process's thread pool is started whole before it serves (`server.runtime.threadpool`):
no thread is started from the event loop later."""

from __future__ import annotations

import asyncio
import threading
import time

from server.runtime.threadpool import OneAtATime, started_pool


def test_every_thread_of_the_pool_runs_before_it_is_used() -> None:
    before = threading.active_count()
    pool = started_pool(4)
    try:
        assert threading.active_count() == before + 4
        names = {t.name for t in threading.enumerate() if t.name.startswith("stampd-io")}
        assert len(names) == 4
        assert [f.result() for f in [pool.submit(lambda i=i: i * i) for i in range(8)]] == [
            i * i for i in range(8)]
        assert threading.active_count() == before + 4  # (none started on demand)
    finally:
        pool.shutdown(wait=True)
    assert threading.active_count() == before


def test_stored_pieces_are_read_one_at_a_time() -> None:
    """24 readers starting at once read their pieces one after the other, in one thread at a
    time (each holds the GIL while it copies its MiB: the event loop waited behind them)."""
    read_piece = OneAtATime()
    lock = threading.Lock()
    now = [0]
    most = [0]

    def piece(reader: int, seq: int) -> bytes:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.002)
        with lock:
            now[0] -= 1
        return bytes([reader, seq])

    async def readers() -> list[bytes]:
        return await asyncio.gather(*(read_piece(piece, r, 0) for r in range(24)))

    got = asyncio.run(readers())
    assert got == [bytes([r, 0]) for r in range(24)]
    assert most[0] == 1
