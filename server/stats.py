"""In-process counters of the service: requests by kind and status, signing and journal
latencies, worker disconnects. The hot path only increments integers and appends to fixed
histograms; `server.api.metrics` turns them into Prometheus metric families at scrape time."""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

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

    def request(self, kind: str, status: int) -> None:
        self.requests[(kind, status)] += 1
