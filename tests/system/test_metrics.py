"""/metrics (Prometheus) and /readyz with named checks."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Server, seed_data_dir, stamp_tag, start_server, wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module: a peer that never answers (its cross-stamps fail, and it is
    stale one second after a stamp waits for it)."""
    data = seed_data_dir(tmp_path_factory.mktemp("metrics") / "data")
    srv = start_server(data, workers=1, commit_interval=1,
                       extra_env={"STAMPD_PEERS": "nobody=http://127.0.0.1:9/",
                                  "STAMPD_PEER_STALE_AFTER": "1"})
    yield srv
    srv.stop()


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


def test_metrics_count_requests_and_latency(server: Server) -> None:
    # The module's other test stamps on this server too: these three are counted on top.
    before = value(scrape(server), "stampd_requests_total", type="tag", status="200")
    signed = value(scrape(server), "stampd_signing_seconds_count")
    for i in range(3):
        stamp_tag(server, f"{i + 1:040x}")
    wait_for(lambda: value(scrape(server), "stampd_peer_failures_total", peer="nobody") >= 1,
             what="a failed cross-stamp")
    m = scrape(server)
    assert value(m, "stampd_requests_total", type="tag", status="200") == before + 3
    assert value(m, "stampd_workers_connected") == 1
    assert value(m, "stampd_signing_seconds_count") >= signed + 3
    assert value(m, "stampd_journal_commit_seconds_count") >= 1
    assert value(m, "stampd_log_last_commit_age_seconds") >= 0
    assert value(m, "stampd_peer_last_success_age_seconds", peer="nobody") == -1
    assert "stampd_queue_depth" in m
    assert value(m, "stampd_event_loop_lag_seconds_count") >= 1  # (a probe every 10 ms)
    assert "stampd_event_loop_lag_max_seconds" in m


def test_readyz_names_each_check(server: Server) -> None:
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


def test_a_refused_manifest_is_counted_as_a_manifest_request(server: Server) -> None:
    def refused() -> tuple[float, float]:
        m = scrape(server)
        return (value(m, "stampd_requests_total", type="manifest", status="415"),
                value(m, "stampd_requests_total", type="digest", status="415"))

    before = refused()
    req = urllib.request.Request(server.url + "v1/manifests", data=b"x\n", method="POST",
                                 headers={"Content-Type": "image/png"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 415
    assert refused() == (before[0] + 1, before[1])  # (a manifest's, not a digest stamp's)
