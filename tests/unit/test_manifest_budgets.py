"""The hourly byte budgets of POST /v1/manifests (`server.api.manifests.ByteRateLimit`) with
an injected clock: two limiters on one file stand for two HTTP processes of one host."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.api.manifests import ByteRateLimit, InFlight, ManifestsBusy, RateLimited, client_key

HOUR = 1_795_399_200  # a whole hour, Unix seconds


def limiters(tmp_path: Path, now: list[float], per_client: int, per_host: int
             ) -> tuple[ByteRateLimit, ByteRateLimit]:
    path = tmp_path / "run" / "manifest-bytes"
    return (ByteRateLimit(path, per_client, per_host, lambda: now[0]),
            ByteRateLimit(path, per_client, per_host, lambda: now[0]))


def test_a_client_over_its_hour_is_refused_until_the_next_hour(tmp_path: Path) -> None:
    now = [HOUR + 600.0]
    a, b = limiters(tmp_path, now, per_client=1000, per_host=0)
    a.charge(b"x", 600)
    with pytest.raises(RateLimited) as e:
        b.charge(b"x", 500)  # the other process sees the first one's bytes
    assert e.value.retry_after == 3000  # the rest of the hour
    b.charge(b"x", 400)  # a refused request counted nothing
    b.charge(b"y", 1000)  # another client has its own budget
    with pytest.raises(RateLimited):
        a.charge(b"x", 1)
    now[0] = HOUR + 3600.0  # the next hour: counters from 0
    a.charge(b"x", 1000)


def test_the_host_budget_holds_across_processes(tmp_path: Path) -> None:
    now = [HOUR + 3599.5]
    a, b = limiters(tmp_path, now, per_client=0, per_host=1000)
    a.charge(b"1", 500)
    b.charge(b"2", 500)
    with pytest.raises(RateLimited) as e:
        a.charge(b"3", 1)
    assert e.value.retry_after == 1


def test_no_limit_counts_nothing(tmp_path: Path) -> None:
    a, _ = limiters(tmp_path, [HOUR], per_client=0, per_host=0)
    a.charge(b"x", 1 << 40)
    assert not (tmp_path / "run").exists()


def test_an_ipv6_site_is_one_client() -> None:
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1")
    assert client_key("2001:db8::1") != client_key("2001:db8:0:1::1")
    assert client_key("::ffff:192.0.2.1") == client_key("192.0.2.1")


def test_bytes_in_flight_beyond_the_share_are_refused() -> None:
    budget = InFlight(limit=1000, processes=2)
    # One manifest is always taken, whatever its size.
    with budget.hold(2000), pytest.raises(ManifestsBusy), budget.hold(1):
        pass
    with budget.hold(300), budget.hold(200), pytest.raises(ManifestsBusy), budget.hold(1):
        pass
    assert budget.held == 0


def test_the_default_budget_takes_two_maximal_manifests_at_once() -> None:
    # The whole server holds about 4.5 times the bytes in flight at its peak (docs/manifests.md):
    # two maximal manifests keep it within 1.5 GiB (bench.manifest_flood); a third waits.
    from server.settings import Settings

    s = Settings()
    flight = InFlight(s.manifest_bytes_in_flight, 1)
    with (flight.hold(s.max_manifest_bytes), flight.hold(s.max_manifest_bytes),
          pytest.raises(ManifestsBusy)):
        flight.hold(s.max_manifest_bytes).__enter__()
    assert flight.held == 0
