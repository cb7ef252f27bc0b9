"""/metrics (Prometheus) and /readyz with named checks."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Server, stamp_tag, start_server, wait_for


def scrape(server: Server) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(server.url + "metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str,
          **labels: str) -> float:
    return sum(v for lab, v in metrics.get(name, []) if all(lab.get(k) == x
                                                            for k, x in labels.items()))


def test_metrics_count_requests_and_latency(seeded_dir: Path,
                                            server_factory: list[Server]) -> None:
    server = start_server(seeded_dir, workers=1, commit_interval=2,
                          extra_env={"STAMPD_PEERS": "nobody=http://127.0.0.1:9/"})
    server_factory.append(server)
    for i in range(3):
        stamp_tag(server, f"{i + 1:040x}")
    wait_for(lambda: value(scrape(server), "stampd_peer_failures_total", peer="nobody") >= 1,
             what="a failed cross-stamp")
    m = scrape(server)
    assert value(m, "stampd_requests_total", type="tag", status="200") == 3
    assert value(m, "stampd_workers_connected") == 1
    assert value(m, "stampd_signing_seconds_count") >= 3
    assert value(m, "stampd_journal_commit_seconds_count") >= 1
    assert value(m, "stampd_log_last_commit_age_seconds") >= 0
    assert value(m, "stampd_peer_last_success_age_seconds", peer="nobody") == -1
    assert "stampd_queue_depth" in m


def test_readyz_names_each_check(seeded_dir: Path, server_factory: list[Server]) -> None:
    server = start_server(seeded_dir, workers=1, commit_interval=1,
                          extra_env={"STAMPD_PEERS": "nobody=http://127.0.0.1:9/",
                                     "STAMPD_PEER_STALE_AFTER": "1"})
    server_factory.append(server)
    _status, body = server.get_json("/readyz")
    checks = body["checks"]
    assert {"database", "workers", "log", "peer:nobody"} <= set(checks)  # type: ignore[arg-type]
    stamp_tag(server, "9" * 40)

    def peer_reported() -> bool:
        status, body = server.get_json("/readyz")
        return status == 503 and not body["checks"]["peer:nobody"]["ok"]  # type: ignore[index]

    wait_for(peer_reported, timeout=20, what="the stale peer in /readyz")
    _, body = server.get_json("/readyz")
    assert body["checks"]["database"]["ok"] and body["checks"]["workers"]["ok"]  # type: ignore[index]
