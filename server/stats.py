"""In-process counters of the service: requests by kind and status, signing and journal
latencies, worker disconnects. The hot path only increments integers and appends to fixed
histograms; `server.api.metrics` turns them into Prometheus metric families at scrape time."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def add(self, counts: list[int], total: float) -> None:
        self.counts = [a + b for a, b in zip(self.counts, counts, strict=True)]
        self.total += total

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*LATENCY_BUCKETS, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


@dataclass
class Stats:
    requests: defaultdict[tuple[str, int], int] = field(
        default_factory=lambda: defaultdict(int))  # (type, status) -> count
    signing: defaultdict[str, Histogram] = field(
        default_factory=lambda: defaultdict(Histogram))  # worker -> seconds
    journal_commit: Histogram = field(default_factory=Histogram)
    worker_disconnects: int = 0
    loop_lag: Histogram = field(default_factory=Histogram)  # server.runtime.looplag
    loop_lag_max: float = 0.0  # seconds: the longest lag since the process started
    proof_waiters: int = 0  # GET /v1/proofs ?wait= requests waiting now (server.tlog.waiters)
    proof_waiters_refused: int = 0  # ... refused (503) for want of room

    def request(self, kind: str, status: int) -> None:
        self.requests[(kind, status)] += 1

    def loop_lagged(self, seconds: float) -> None:
        self.loop_lag.observe(seconds)
        self.loop_lag_max = max(self.loop_lag_max, seconds)

    # -- several HTTP processes (server.runtime.siblings) ---------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The counters as JSON-ready data, for the other HTTP processes to add up."""
        return {
            "requests": [[kind, status, n] for (kind, status), n in list(self.requests.items())],
            "signing": {w: [h.counts, h.total] for w, h in list(self.signing.items())},
            "journal_commit": [self.journal_commit.counts, self.journal_commit.total],
            "worker_disconnects": self.worker_disconnects,
            "loop_lag": [self.loop_lag.counts, self.loop_lag.total],
            "loop_lag_max": self.loop_lag_max,
            "proof_waiters": self.proof_waiters,
            "proof_waiters_refused": self.proof_waiters_refused,
        }

    def add(self, snapshot: dict[str, Any]) -> None:
        """Add another process's `snapshot` to these counters."""
        for kind, status, n in snapshot["requests"]:
            self.requests[(kind, status)] += n
        for worker, (counts, total) in snapshot["signing"].items():
            self.signing[worker].add(counts, total)
        self.journal_commit.add(*snapshot["journal_commit"])
        self.worker_disconnects += snapshot["worker_disconnects"]
        self.loop_lag.add(*snapshot["loop_lag"])
        self.loop_lag_max = max(self.loop_lag_max, snapshot["loop_lag_max"])
        self.proof_waiters += snapshot.get("proof_waiters", 0)
        self.proof_waiters_refused += snapshot.get("proof_waiters_refused", 0)

    def plus(self, snapshots: Iterable[dict[str, Any]]) -> Stats:
        """A new `Stats`: these counters and the ``snapshots`` added up."""
        total = Stats()
        for s in (self.snapshot(), *snapshots):
            total.add(s)
        return total
