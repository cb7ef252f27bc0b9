"""The HTTP process's thread pool (``asyncio.to_thread``, ``run_in_executor(None, ...)``), its
threads started before the process serves.

asyncio makes its default pool's threads on demand, from the event loop: ``Thread.start``
waits until the new thread runs, and on a busy host that is tens of milliseconds in which the
loop serves nothing (a 67 ms stall when 24 readers of a manifest came at once,
``bench.manifest_flood --mode readers``). The same number of threads as asyncio's default,
all started at once: idle, they cost nothing but their stacks' address space.

`OneAtATime` runs one kind of work in that pool one call at a time: work that holds the GIL
for long (a manifest checked, a stored piece copied, a receipts page built) and would take
the event loop's turns from it with every more thread doing it at once."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

SIZE = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default pool size
START_WAIT = 10.0  # seconds the starting tasks wait for the last thread at most


def started_pool(size: int = SIZE) -> ThreadPoolExecutor:
    """A pool of ``size`` threads, every one of them running (each took a task that waited
    until all had one, so none was idle when the next was submitted)."""
    pool = ThreadPoolExecutor(size, thread_name_prefix="stampd-io")
    all_in = threading.Event()
    tasks = [pool.submit(all_in.wait, START_WAIT) for _ in range(size)]
    all_in.set()
    wait(tasks)
    return pool


class OneAtATime:
    """Calls a blocking function in the pool (``asyncio.to_thread``), one call at a time of
    those that share this object (each HTTP process has its own)."""

    def __init__(self) -> None:
        self._one = asyncio.Semaphore(1)

    async def __call__(self, f: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        async with self._one:
            return await asyncio.to_thread(f, *args, **kwargs)
