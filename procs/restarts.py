"""One restart policy for every process stampd supervises: the signing workers (`workers.pool`),
the worker supervisor (`server.supervisor`), the HTTP processes and their manager
(`server.http_processes`).

A process that exited after it had lived `YOUNG` seconds or more is started again at once: it
had been working, and what ended it (a signal, an agent that died) is not known to come back;
the sooner its replacement serves, the fewer requests wait (an HTTP process's connections wait
in its socket's backlog, a worker's jobs go to the others). One that exits younger *died young*:
each young death in a row doubles the wait before its next start, from `FIRST` up to a cap
(`MAX_BACKOFF`; the workers of a key that cannot be loaded wait up to 30 s), so that a process
that cannot start (a port, a key, a full disk) costs a few starts a minute instead of a busy
loop, and one that can again is back within the cap. A life past `YOUNG` starts the count
afresh.

Before, the HTTP processes, their manager and the worker supervisor each had a loop of their own
that waited a fixed second whatever had happened, and only the workers backed off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

YOUNG = 5.0  # seconds: a process that exits sooner died young; one that lives longer is stable
FIRST = 0.2  # seconds before the start that follows a first young death
MAX_BACKOFF = 5.0  # seconds: the longest wait before a process that keeps dying young


@dataclass
class Restarts:
    """When to start a supervised process again. Call `started` when it starts and `exited`
    when it has exited (which says how long it lived and how long to wait); start it when
    `due`. ``clock``: seconds, monotonic (injected by tests)."""

    cap: float = MAX_BACKOFF
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    young_deaths: int = 0  # young deaths in a row
    count: int = 0  # exits seen (each one a restart, unless the supervisor stops)
    start_time: float = 0.0
    due_time: float = 0.0

    def started(self) -> None:
        self.start_time = self.clock()

    def lived(self) -> float:
        """Seconds since the last start."""
        return self.clock() - self.start_time

    @property
    def stable(self) -> bool:
        """It has lived past its youth (`YOUNG`)."""
        return self.lived() >= YOUNG

    def exited(self, cap: float | None = None) -> tuple[float, float]:
        """It exited now: the seconds it lived, and those to wait before starting it again
        (0: at once), which `due` then counts down. ``cap``: another longest wait than `cap`
        for this exit."""
        now = self.clock()
        lived = now - self.start_time
        self.young_deaths = self.young_deaths + 1 if lived < YOUNG else 0
        self.count += 1
        delay = (min(FIRST * 2 ** (self.young_deaths - 1), self.cap if cap is None else cap)
                 if self.young_deaths else 0.0)
        self.due_time = now + delay
        return lived, delay

    def due(self) -> bool:
        """The wait `exited` set is over."""
        return self.clock() >= self.due_time
