"""What the HTTP processes of one `stampd serve` tell each other, through the host's
coordinator (`server.coordinator`): each reports its counters and its view of the workers (and
the witnesses' states, where it sends the checkpoints to them) four times a second, and ``GET
/metrics`` and ``GET /readyz`` (and the status page), whichever process answers them, ask the
coordinator for every process's last report and add them up or check them.

A process's figures are up to `PUBLISH_EVERY` seconds old (the answering process's own are
live). A report older than `STALE_AFTER` seconds (its event loop is stuck), or none (it is not
connected: it died, and the coordinator forgot its report with its connection), means that
process is not serving: ``/readyz`` says so (the supervisor restarts it). A restarted process
starts its counters from zero, as a restarted server would. (Each process wrote its report to a
file under ``run/api/`` before, and the witnesses' sender its states to ``run/witnesses.json``.)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.coordinator import CoordinatorLink
from server.dispatch import Dispatcher
from server.stats import Stats

PUBLISH_EVERY = 0.25
STALE_AFTER = 5.0


@dataclass(frozen=True)
class Sibling:
    """One other HTTP process, as its last report shows it (``record`` None: none)."""

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
    """The figures of every HTTP process: this one's, live, and the others' last reports,
    added up."""

    own: Stats
    queue: int  # jobs waiting for a worker
    requeued: int  # jobs handed to another worker after a fault
    others: list[Sibling]
    disconnects: int = 0  # worker connections lost, as the host's dispatcher counts them

    def stats(self) -> Stats:
        """The counters, added up (only /metrics needs them)."""
        reports = [o.stats for o in self.others if o.stats is not None]
        if not reports and not self.disconnects:
            return self.own
        total = self.own.plus(reports)  # (a new one: this process's counters stay its own)
        total.worker_disconnects += self.disconnects
        return total


async def overview(stats: Stats, dispatcher: Dispatcher, siblings: Siblings | None
                   ) -> Overview:
    """The figures of every HTTP process, and of the host's dispatcher where it is the
    coordinator's (each process's own queue is then empty)."""
    others = [] if siblings is None else await siblings.others()
    records = [o.record for o in others if o.record is not None]
    host = {} if siblings is None else siblings.link.host
    return Overview(stats, dispatcher.queue_depth + sum(r["queue"] for r in records)
                    + host.get("queue", 0),
                    dispatcher.requeued + sum(r["requeued"] for r in records)
                    + host.get("requeued", 0),
                    others, host.get("disconnects", 0))


class Siblings:
    """Process ``index`` of ``count``: reports its own figures to the coordinator through
    ``link``, and asks it for the others'."""

    def __init__(self, link: CoordinatorLink, index: int, count: int, stats: Stats,
                 dispatcher: Dispatcher,
                 witnesses: Callable[[], list[dict[str, Any]] | None] = lambda: None) -> None:
        self.link = link
        self.witnesses = witnesses  # the witnesses' states where this process sends to them
        self.index = index
        self.count = count
        self.stats = stats
        self.dispatcher = dispatcher
        self._task: asyncio.Task[None] | None = None

    def record(self) -> dict[str, Any]:
        # (no time: a report's age is the coordinator's to say, by its own clock)
        record = {"index": self.index, "pid": os.getpid(),
                  "stats": self.stats.snapshot(), "queue": self.dispatcher.queue_depth,
                  "requeued": self.dispatcher.requeued,
                  "workers": sorted(self.dispatcher.workers)}
        witnesses = self.witnesses()
        if witnesses is not None:
            record["witnesses"] = witnesses
        return record

    async def others(self) -> list[Sibling]:
        """Every other process's last report (none where the coordinator has none)."""
        reports = {}
        for report in await self.link.view():
            record = report.get("record")
            if isinstance(record, dict) and record.get("index") != self.index:
                reports[record.get("index")] = Sibling(record["index"], record,
                                                       float(report.get("age", 0.0)))
        return [reports.get(i, Sibling(i, None, float("inf")))
                for i in range(self.count) if i != self.index]

    def report(self) -> None:
        """Tell the coordinator this process's figures now (also when the witnesses' states
        change, so that every process shows them at once)."""
        self.link.report(self.record())

    # -- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        self.report()
        self._task = asyncio.create_task(self._run(), name="report-stats")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_EVERY)
            self.report()  # (the record is taken in the loop that updates the counters)
