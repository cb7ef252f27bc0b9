"""The HTTP process's thread pool (``asyncio.to_thread``, ``run_in_executor(None, ...)``), its
threads started before the process serves.

asyncio makes its default pool's threads on demand, from the event loop: ``Thread.start``
waits until the new thread runs, and on a busy host that is tens of milliseconds in which the
loop serves nothing (a 67 ms stall when 24 readers of a manifest came at once,
``bench.manifest_flood --mode readers``). The same number of threads as asyncio's default,
all started at once: idle, they cost nothing but their stacks' address space."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

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
