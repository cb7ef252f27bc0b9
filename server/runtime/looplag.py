"""The event loop's lag, measured inside each HTTP process: ``stampd_event_loop_lag_seconds``.

Every request a process serves waits while its event loop runs something else: a callback that
holds the loop (a large body copied, a long computation) or the process waiting for a core or
for the GIL. `watch` sleeps `INTERVAL` at a time while clients are connected (`IDLE_INTERVAL`
when none is: a wake-up costs ~0.2 ms of CPU on a small virtual machine, and an idle server
should sleep) and records how much later than asked the loop woke it: a stall of the loop
delays every request it serves by as much, and a lag with no stall behind it is the host's
load. (A probe from outside, ``GET /healthz``, measures the same plus its own round trip and
its own wait for a core: `bench.manifest_flood` shows both.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from server.stats import Stats

INTERVAL = 0.01  # seconds between the probe's wake-ups while clients are connected
IDLE_INTERVAL = 0.25  # and while none is


async def watch(stats: Stats, busy: Callable[[], bool], interval: float = INTERVAL,
                idle_interval: float = IDLE_INTERVAL) -> None:
    """Record the loop's lag in ``stats`` (``loop_lag``, ``loop_lag_max``) until cancelled,
    a wake-up every ``interval`` while ``busy()`` (clients connected), else every
    ``idle_interval``. The loop's own clock on both ends: a timer is due its delay after the
    loop's time when it was set (uvloop's time is that of the start of the loop's turn), so
    the lag is how late the loop ran it. (A stall that ends before the timer is due is not
    seen: with 10 ms between wake-ups a stall of S shows as a lag of at least S - 10 ms.)"""
    loop = asyncio.get_running_loop()
    while True:
        step = interval if busy() else idle_interval
        asked = loop.time()
        await asyncio.sleep(step)
        stats.loop_lagged(max(0.0, loop.time() - asked - step))
