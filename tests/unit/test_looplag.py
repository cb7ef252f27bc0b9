"""The event loop's lag probe (`server.runtime.looplag`): a callback that holds the loop shows as
a lag at least as long as it held it, on both loops stampd runs on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import uvloop

from server.runtime import looplag
from server.stats import LATENCY_BUCKETS, Stats

HOLD = 0.12  # seconds a callback holds the loop


async def _stalled(stats: Stats) -> None:
    watcher = asyncio.create_task(looplag.watch(stats, busy=lambda: True, interval=0.01))
    await asyncio.sleep(0.05)  # (some turns unstalled first)
    before = sum(stats.loop_lag.counts)
    asyncio.get_running_loop().call_soon(time.sleep, HOLD)  # a callback holding the loop
    while sum(stats.loop_lag.counts) < before + 2:  # the stalled wake-up, and one after it
        await asyncio.sleep(0.01)
    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop],
                         ids=["asyncio", "uvloop"])
def test_a_callback_holding_the_loop_is_a_lag_as_long(
        new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    stats = Stats()
    loop = new_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(_stalled(stats), 30))
    finally:
        loop.close()
    # The timer due 10 ms after the last wake-up before the stall ran once the callback had
    # let go: at least HOLD - 10 ms late.
    assert stats.loop_lag_max >= HOLD - 0.01
    over = LATENCY_BUCKETS.index(0.1)  # observations above 100 ms are counted past this bucket
    assert sum(stats.loop_lag.counts[over + 1:]) >= 1
    assert stats.loop_lag.total >= HOLD - 0.01


def test_without_clients_the_probe_wakes_rarely() -> None:
    """An idle server sleeps: without connected clients the probe wakes every
    `IDLE_INTERVAL`, and at once every `INTERVAL` again when one connects."""
    stats = Stats()
    connected = [False]

    async def scenario() -> tuple[int, int]:
        watcher = asyncio.create_task(looplag.watch(stats, busy=lambda: connected[0],
                                                    interval=0.01, idle_interval=0.2))
        await asyncio.sleep(0.5)  # idle: at most 2 wake-ups (each at least 0.2 s after the last)
        idle = sum(stats.loop_lag.counts)
        connected[0] = True
        while sum(stats.loop_lag.counts) < idle + 10:  # busy: ten more come
            await asyncio.sleep(0.01)
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher
        return idle, sum(stats.loop_lag.counts)

    idle, total = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert 1 <= idle <= 2
    assert total >= idle + 10
