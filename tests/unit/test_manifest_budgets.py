"""The host's budgets (`server.budgets`): the hourly manifest bytes and the witness's requests
a minute with an injected clock, and the manifest bytes in flight held by owners (the HTTP
processes). (Across processes, through the coordinator: tests/integration/test_coordinator.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from server.budgets import (
    MANIFEST_HOUR,
    WITNESS_MINUTE,
    HostBudgets,
    InFlight,
    LocalBudgets,
    ManifestsBusy,
    RateLimited,
    WindowBudget,
    client_key,
)
from server.settings import Settings

HOUR = 1_795_399_200  # a whole hour, Unix seconds


def test_a_client_over_its_hour_is_refused_until_the_next_hour() -> None:
    now = [HOUR + 600.0]
    budget = WindowBudget(1000, 0, lambda: now[0])
    budget.charge(b"x", 600)
    with pytest.raises(RateLimited) as e:
        budget.charge(b"x", 500)
    assert e.value.retry_after == 3000  # the rest of the hour
    assert "this client sent 600 of its 1000 bytes this hour" in e.value.message
    budget.charge(b"x", 400)  # a refused request counted nothing
    budget.charge(b"y", 1000)  # another client has its own budget
    with pytest.raises(RateLimited):
        budget.charge(b"x", 1)
    now[0] = HOUR + 3600.0  # the next hour: counters from 0
    budget.charge(b"x", 1000)


def test_the_host_budget_holds_for_all_clients() -> None:
    now = [HOUR + 3599.5]
    budget = WindowBudget(0, 1000, lambda: now[0])
    budget.charge(b"1", 500)
    budget.charge(b"2", 500)
    with pytest.raises(RateLimited) as e:
        budget.charge(b"3", 1)
    assert e.value.retry_after == 1
    assert "this server took 1000 of its 1000 bytes this hour" in e.value.message


def test_no_limit_counts_nothing() -> None:
    budget = WindowBudget(0, 0, lambda: HOUR)
    budget.charge(b"x", 1 << 40)
    assert len(budget._clients) == 0  # (not even its counters made)


def test_the_witness_counts_requests_a_clock_minute(tmp_path: Path) -> None:
    now = [HOUR + 30.0]
    s = Settings(data_dir=tmp_path, witness_requests_per_client_minute=2)
    budgets = HostBudgets(s, lambda: now[0])
    budgets.charge(WITNESS_MINUTE, b"log", 1)
    budgets.charge(WITNESS_MINUTE, b"log", 1)
    with pytest.raises(RateLimited) as e:
        budgets.charge(WITNESS_MINUTE, b"log", 1)
    assert e.value.retry_after == 30 and "add-checkpoint requests this minute" in e.value.message
    now[0] = HOUR + 60.0
    budgets.charge(WITNESS_MINUTE, b"log", 1)
    with pytest.raises(ValueError):
        budgets.charge("no-such-budget", b"log", 1)


def test_an_ipv6_site_is_one_client() -> None:
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1")
    assert client_key("2001:db8::1") != client_key("2001:db8:0:1::1")
    assert client_key("::ffff:192.0.2.1") == client_key("192.0.2.1")


def test_bytes_in_flight_are_one_budget_for_all_the_hosts_http_processes() -> None:
    flight = InFlight(1000)
    flight.take(1, 600)
    with pytest.raises(ManifestsBusy) as e:
        flight.take(2, 500)
    assert "600 bytes of manifests in flight on this server (of 1000)" in e.value.message
    flight.take(2, 400)
    with pytest.raises(ManifestsBusy):
        flight.take(1, 1)
    flight.give(1, 600)
    flight.give(2, 400)
    flight.take(2, 1000)  # given back: the whole budget again
    assert flight.total == 1000


def test_one_manifest_is_always_taken_when_none_is_in_flight_on_the_host() -> None:
    flight = InFlight(1000)
    flight.take(1, 2000)
    with pytest.raises(ManifestsBusy):
        flight.take(2, 1)  # (before, each process took one of its own)


def test_what_an_owner_that_is_gone_held_counts_nothing() -> None:
    flight = InFlight(1000)
    flight.take(1, 900)
    flight.take(1, 50)
    flight.drop(1)  # (its connection to the coordinator closed)
    flight.take(2, 1000)
    assert flight.held == {2: 1000}


def test_the_default_budget_takes_two_maximal_manifests_at_once(tmp_path: Path) -> None:
    # The whole server holds about 4.5 times the bytes in flight at its peak (docs/manifests.md):
    # two maximal manifests keep it within 1.5 GiB (bench.manifest_flood); a third waits.
    s = Settings(data_dir=tmp_path)
    local = LocalBudgets(HostBudgets(s, lambda: HOUR))

    async def main() -> None:
        gives = [await local.take(s.max_manifest_bytes) for _ in range(2)]
        with pytest.raises(ManifestsBusy):
            await local.take(s.max_manifest_bytes)
        for give in gives:
            give()
            give()  # (once: a second call gives nothing more back)
        assert local.budgets.in_flight.total == 0
        await local.charge(MANIFEST_HOUR, b"x", 1 << 30)  # (no hourly limit by default)

    asyncio.run(main())
