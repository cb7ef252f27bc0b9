"""The one restart policy of every supervised process (`procs.restarts`), and the HTTP
manager's loop that follows it, on an injected clock."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from procs.restarts import FIRST, MAX_BACKOFF, YOUNG, Restarts
from server.http_processes import ApiProcesses
from server.settings import Settings


class Clock:
    """Seconds that move only when told (`advance`), or by ``step`` at each reading."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = 1000.0
        self.step = step
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.step
            return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_young_deaths_double_the_wait_up_to_the_cap_and_a_stable_life_starts_afresh() -> None:
    clock = Clock()
    r = Restarts(clock=clock)
    waits = []
    for _ in range(8):
        r.started()
        clock.advance(1.0)  # (younger than YOUNG)
        lived, wait = r.exited()
        assert lived == pytest.approx(1.0)
        waits.append(wait)
        assert not r.due()
        clock.advance(waits[-1])
        assert r.due()
    assert waits == [FIRST * 2 ** n for n in range(5)] + [MAX_BACKOFF] * 3
    assert r.young_deaths == 8 and r.count == 8

    r.started()
    clock.advance(YOUNG)
    assert r.stable
    lived, wait = r.exited()
    assert lived == pytest.approx(YOUNG) and wait == 0.0 and r.due()  # it had worked: at once
    assert r.young_deaths == 0

    r.started()
    assert not r.stable
    assert r.exited()[1] == FIRST  # the count starts afresh
    r.started()
    assert r.exited(cap=0.3)[1] == 0.3  # another cap for this exit (a key that cannot be loaded)


class _Child:
    """A process that lives ``life`` seconds of ``clock`` from its start."""

    def __init__(self, clock: Clock, life: float) -> None:
        self.pid = 0
        self.returncode: int | None = None
        self.clock = clock
        self.end = clock.now + life
        self.seen_dead: float | None = None  # when `poll` first said it had exited

    def poll(self) -> int | None:
        if self.returncode is None and self.clock() >= self.end:  # (time moves on)
            self.returncode = 1
            self.seen_dead = self.clock.now
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.returncode = -sig

    def terminate(self) -> None:
        self.returncode = -15

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0


@pytest.fixture
def sock() -> socket.socket:
    s = socket.socket()
    yield s
    s.close()


def test_the_http_manager_restarts_its_processes_by_the_policy(tmp_path: Path,
                                                               sock: socket.socket) -> None:
    """Every HTTP process that dies young waits longer before its next start, up to the cap;
    one that had lived past its youth is started again at once."""
    lives = [0.0] * 7 + [YOUNG + 1] + [0.0] * 2
    expected = [FIRST * 2 ** n for n in range(5)] + [MAX_BACKOFF] * 2 + [0.0, FIRST]
    clock = Clock(step=0.01)
    children: list[_Child] = []
    starts: list[float] = []

    class Manager(ApiProcesses):
        def _fork(self, index: int) -> None:
            starts.append(clock.now)
            child = _Child(clock, lives[len(children)] if len(children) < len(lives) else 1e9)
            children.append(child)
            self.procs[index] = child

    manager = Manager(Settings(data_dir=tmp_path), [sock], clock=clock)
    thread = threading.Thread(target=manager.run, kwargs={"poll": 0.0005}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while len(starts) <= len(expected) and time.monotonic() < deadline:
        time.sleep(0.01)
    manager.stopping.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(starts) > len(expected), starts
    for n, wait in enumerate(expected):
        dead = children[n].seen_dead
        assert dead is not None
        gap = starts[n + 1] - dead
        assert wait <= gap < wait + 0.5, (n, gap, wait)
