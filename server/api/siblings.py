"""What the HTTP processes of one `stampd serve` tell each other: each writes its counters and
its view of the workers to ``<data_dir>/run/api/<n>.json`` four times a second, and ``GET /metrics``
and ``GET /readyz``, whichever process answers them, add up or check every process's file.

A process's figures are read from its file, so they are up to `PUBLISH_EVERY` seconds old (the
answering process's own are live). A file older than `STALE_AFTER` seconds, or missing, means
that process is not serving: ``/readyz`` says so (the supervisor restarts it within about a
second). A restarted process starts its counters from zero, as a restarted server would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.dispatch import Dispatcher
from server.stats import Stats

log = logging.getLogger(__name__)

PUBLISH_EVERY = 0.25
STALE_AFTER = 5.0


@dataclass(frozen=True)
class Sibling:
    """One other HTTP process, as its last file shows it (``record`` None: no file)."""

    index: int
    record: dict[str, Any] | None
    age: float

    @property
    def serving(self) -> bool:
        return self.record is not None and self.age <= STALE_AFTER

    @property
    def stats(self) -> dict[str, Any] | None:
        return None if self.record is None else self.record["stats"]


@dataclass(frozen=True)
class Overview:
    """The figures of every HTTP process: this one's, live, and the others' last reports
    (each file read once), added up."""

    own: Stats
    queue: int  # jobs waiting for a worker
    requeued: int  # jobs handed to another worker after a fault
    taken_back: int  # jobs taken back from a worker busy with another process's manifest
    others: list[Sibling]

    def stats(self) -> Stats:
        """The counters, added up (only /metrics needs them)."""
        reports = [o.stats for o in self.others if o.stats is not None]
        return self.own.plus(reports) if reports else self.own


def overview(stats: Stats, dispatcher: Dispatcher, siblings: Siblings | None) -> Overview:
    others = [] if siblings is None else siblings.others()
    records = [o.record for o in others if o.record is not None]
    return Overview(stats, dispatcher.queue_depth + sum(r["queue"] for r in records),
                    dispatcher.requeued + sum(r["requeued"] for r in records),
                    dispatcher.taken_back + sum(r.get("taken_back", 0) for r in records),
                    others)


class Siblings:
    """Process ``index`` of ``count``: publishes its own file, reads the others'."""

    def __init__(self, run_dir: Path, index: int, count: int, stats: Stats,
                 dispatcher: Dispatcher, clock: Callable[[], float] = time.time) -> None:
        self.dir = run_dir / "api"
        self.index = index
        self.count = count
        self.stats = stats
        self.dispatcher = dispatcher
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    def path(self, index: int) -> Path:
        return self.dir / f"{index}.json"

    def record(self) -> dict[str, Any]:
        return {"index": self.index, "pid": os.getpid(), "time": self.clock(),
                "stats": self.stats.snapshot(), "queue": self.dispatcher.queue_depth,
                "requeued": self.dispatcher.requeued,
                "taken_back": self.dispatcher.taken_back,
                "workers": sorted(self.dispatcher.workers)}

    def write(self, record: dict[str, Any]) -> None:
        """Write this process's file (atomically: a reader sees the old or the new one)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{self.index}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path(self.index))

    def others(self) -> list[Sibling]:
        out = []
        now = self.clock()
        for i in range(self.count):
            if i == self.index:
                continue
            try:
                record = json.loads(self.path(i).read_text())
            except (OSError, ValueError):
                out.append(Sibling(i, None, float("inf")))
                continue
            out.append(Sibling(i, record, now - float(record["time"])))
        return out

    # -- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        self.write(self.record())
        self._task = asyncio.create_task(self._run(), name="publish-stats")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(OSError):
            self.path(self.index).unlink()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_EVERY)
            try:
                # (the record is taken here, in the loop that updates the counters)
                await asyncio.to_thread(self.write, self.record())
            except OSError as e:
                log.warning("cannot write %s: %s", self.path(self.index), e)
