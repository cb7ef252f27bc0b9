"""Prometheus metrics, collected at scrape time from plain counters.

The hot path only increments integers and appends to fixed histograms (no locks, no label
lookups in prometheus-client); `StampdCollector` turns them into metric families when
``GET /metrics`` is scraped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from server.api.services import Services
from server.runtime import looplag
from server.runtime.siblings import Overview
from server.stats import Histogram
from server.tlog.store import checkpoint_size


def _histogram(name: str, doc: str, labels: list[str],
               series: dict[tuple[str, ...], Histogram]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for values, h in series.items():
        fam.add_metric(list(values), h.buckets(), h.total)
    return fam


class StampdCollector(Collector):
    """The metrics of ``s``, every HTTP process's counters in ``total`` added up."""

    def __init__(self, s: Services, total: Overview) -> None:
        self.s = s
        self.total = total

    def collect(self) -> Iterator[Metric]:
        s, total = self.s, self.total
        st = total.stats()
        c = CounterMetricFamily("stampd_requests", "Requests by type and HTTP status (for "
                                "type mail, the SMTP reply's code)", labels=["type", "status"])
        for (kind, status), n in sorted(st.requests.items()):
            c.add_metric([kind, str(status)], n)
        yield c
        yield GaugeMetricFamily("stampd_queue_depth", "Signing jobs waiting for a worker",
                                value=total.queue)
        yield GaugeMetricFamily("stampd_workers_connected", "Signing workers connected",
                                value=len(s.dispatcher.workers))
        key = s.key.fingerprint
        yield _histogram("stampd_signing_seconds",
                         "Time from handing a job to a worker until its answer",
                         ["worker", "key"],
                         {(w, key): h for w, h in list(st.signing.items())})
        yield CounterMetricFamily("stampd_worker_restarts",
                                  "Worker connections lost (a worker or its agent died)",
                                  value=st.worker_disconnects)
        yield CounterMetricFamily("stampd_requeued_jobs",
                                  "Jobs handed to another worker after a fault",
                                  value=total.requeued)
        yield GaugeMetricFamily("stampd_proof_waiters",
                                "Proof requests (GET /v1/proofs ?wait=) waiting for a checkpoint",
                                value=st.proof_waiters)
        yield CounterMetricFamily("stampd_proof_waiters_refused",
                                  "Proof requests answered 503 because as many were waiting "
                                  "as the limits let (STAMPD_PROOF_WAITERS, "
                                  "STAMPD_PROOF_WAITERS_PER_CLIENT)",
                                  value=st.proof_waiters_refused)
        yield _histogram("stampd_journal_commit_seconds", "Duration of grouped journal commits",
                         [], {(): st.journal_commit})
        yield _histogram("stampd_event_loop_lag_seconds",
                         "How late each HTTP process's event loop ran a timer due every "
                         f"{looplag.INTERVAL * 1000:g} ms while clients are connected, every "
                         f"{looplag.IDLE_INTERVAL * 1000:g} ms otherwise (a stall of every "
                         "request it serves, or the host's load)",
                         [], {(): st.loop_lag})
        yield GaugeMetricFamily("stampd_event_loop_lag_max_seconds",
                                "The longest event-loop lag since the HTTP processes started",
                                value=st.loop_lag_max)
        last = s.committer.last_commit_at
        yield GaugeMetricFamily("stampd_log_last_commit_age_seconds",
                                "Seconds since the last log commit (-1: none yet)",
                                value=(time.time() - last) if last else -1)
        age = GaugeMetricFamily("stampd_peer_last_success_age_seconds",
                                "Seconds since the peer last stamped our log (-1: never)",
                                labels=["peer"])
        fails = CounterMetricFamily("stampd_peer_failures",
                                    "Failed cross-stamp attempts", labels=["peer"])
        for p in s.cross.peer_status():
            age.add_metric([p.name], (time.time() - p.last_success) if p.last_success else -1)
            fails.add_metric([p.name], p.failures)
        yield age
        yield fails
        yield from _mail_metrics(s)
        if s.tlog_reader is not None:
            note = s.tlog_reader.checkpoint()
            yield GaugeMetricFamily("stampd_tlog_checkpoint_size",
                                    "Entries of the transparency log's published checkpoint "
                                    "(-1: none yet)",
                                    value=-1 if note is None else checkpoint_size(note))
        yield from _witness_metrics(s, total)
        yield GaugeMetricFamily(
            "stampd_http_processes", "HTTP processes serving (their counters are added up above)",
            value=1 + sum(o.serving for o in total.others))
        each = CounterMetricFamily("stampd_http_process_requests",
                                   "Stamp requests answered by each HTTP process (since it "
                                   "started), counted in stampd_requests_total too",
                                   labels=["process"])
        each.add_metric([str(s.process)], sum(total.own.requests.values()))
        for other in total.others:
            if other.stats is not None:
                each.add_metric([str(other.index)],
                                sum(n for _kind, _status, n in other.stats["requests"]))
        yield each


def _mail_metrics(s: Services) -> Iterator[Metric]:
    """Each email timestamper's last request and reply, overdue state, failures, refusals."""
    if s.mail_stampers is None or not s.mail_stampers.stampers:
        return
    now = time.time()
    sent = GaugeMetricFamily("stampd_mail_stamper_last_sent_age_seconds",
                             "Seconds since a request was last mailed to the email "
                             "timestamper (-1: never)", labels=["stamper"])
    reply = GaugeMetricFamily("stampd_mail_stamper_last_reply_age_seconds",
                              "Seconds since the email timestamper's last good reply "
                              "(-1: never)", labels=["stamper"])
    overdue = GaugeMetricFamily("stampd_mail_stamper_overdue",
                                "1 when a log head has waited longer than "
                                "STAMPD_MAIL_STAMPER_OVERDUE_AFTER for the timestamper's reply",
                                labels=["stamper"])
    fails = CounterMetricFamily("stampd_mail_stamper_failures",
                                "Requests that could not be sent", labels=["stamper"])
    refused = CounterMetricFamily("stampd_mail_stamper_refused_replies",
                                  "Replies refused (bad signature, not quoting a request)",
                                  labels=["stamper"])
    for m in s.mail_stampers.statuses():
        sent.add_metric([m.name], now - m.last_sent if m.last_sent else -1)
        reply.add_metric([m.name], now - m.last_reply if m.last_reply else -1)
        overdue.add_metric([m.name], 1 if m.overdue_since is not None else 0)
        fails.add_metric([m.name], m.failures)
        refused.add_metric([m.name], m.refused)
    yield from (sent, reply, overdue, fails, refused)


def _witness_metrics(s: Services, total: Overview) -> Iterator[Metric]:
    """Each witness's last cosigned size, lag, errors and last cosignature time (none
    without witnesses)."""
    states = s.witness_states(total.others)
    if not states:
        return
    published = s.published_size()
    size = GaugeMetricFamily("stampd_witness_cosigned_size",
                             "Tree size of the last checkpoint the witness cosigned (-1: none)",
                             labels=["witness"])
    lag = GaugeMetricFamily("stampd_witness_lag_entries",
                            "Entries of the published checkpoint the witness has not cosigned "
                            "(-1: no checkpoint yet)", labels=["witness"])
    errors = CounterMetricFamily("stampd_witness_errors",
                                 "Failed add-checkpoint attempts (since the sending process "
                                 "started)", labels=["witness"])
    refused = CounterMetricFamily("stampd_witness_refused_cosignatures",
                                  "Valid cosignatures refused for their time, outside "
                                  "STAMPD_WITNESS_CLOCK_SKEW of this server's clock (since the "
                                  "sending process started)", labels=["witness"])
    last = GaugeMetricFamily("stampd_witness_last_cosigned_timestamp_seconds",
                             "When the witness's last valid cosignature came in, Unix time "
                             "(0: never)", labels=["witness"])
    for w in states:
        behind = w.lag(published)
        size.add_metric([w.name], -1 if w.cosigned_size is None else w.cosigned_size)
        lag.add_metric([w.name], -1 if behind is None else behind)
        errors.add_metric([w.name], w.errors)
        refused.add_metric([w.name], w.refused_cosignatures)
        last.add_metric([w.name], w.cosigned_at or 0)
    yield from (size, lag, errors, refused, last)


def add_metrics_route(app: FastAPI, services: Callable[[], Services]) -> None:

    @app.get("/metrics", tags=["operations"], operation_id="getMetrics",
             summary="Prometheus metrics (text exposition format)",
             response_class=PlainTextResponse, response_description="the metrics")
    async def metrics() -> Response:
        s = services()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StampdCollector(s, await s.overview()))
        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
