"""The budgets of POST /v1/manifests: the hourly bytes (`server.api.manifests.ByteRateLimit`)
with an injected clock, and the bytes in flight (`InFlight`): two limiters on one file stand
for two HTTP processes of one host."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from server.api.manifests import ByteRateLimit, InFlight, ManifestsBusy, RateLimited
from server.api.ratelimit import client_key

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


def flights(tmp_path: Path, limit: int, processes: int = 2) -> list[InFlight]:
    """The budgets of a host's HTTP processes (here all in this test's process: each slot
    names this process, which is running)."""
    return [InFlight(tmp_path / "run" / "manifest-in-flight", limit, i, processes)
            for i in range(processes)]


def test_bytes_in_flight_are_one_budget_for_all_the_hosts_http_processes(
        tmp_path: Path) -> None:
    a, b = flights(tmp_path, 1000)
    with a.hold(600):
        with pytest.raises(ManifestsBusy) as e:
            b.hold(500).__enter__()
        assert "600 bytes of manifests in flight on this server (of 1000)" in e.value.message
        with b.hold(400), pytest.raises(ManifestsBusy):
            a.hold(1).__enter__()
    with b.hold(1000):  # given back: the whole budget again
        pass
    assert a.held == b.held == 0


def test_one_manifest_is_always_taken_when_none_is_in_flight_on_the_host(
        tmp_path: Path) -> None:
    a, b = flights(tmp_path, 1000)
    with a.hold(2000), pytest.raises(ManifestsBusy):
        b.hold(1).__enter__()  # (before, each process took one of its own)
    with b.hold(2000), pytest.raises(ManifestsBusy):
        b.hold(1).__enter__()


def test_a_slot_of_a_process_no_longer_running_counts_nothing(tmp_path: Path) -> None:
    # A real process takes bytes in slot 1 and is killed without giving them back.
    code = ("import sys; from pathlib import Path; from server.api.manifests import InFlight\n"
            f"f = InFlight(Path({str(tmp_path / 'run' / 'manifest-in-flight')!r}), 1000, 1, 2)\n"
            "f.take(900); print('held', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
    try:
        assert child.stdout is not None and child.stdout.readline() == b"held\n"
        a = flights(tmp_path, 1000)[0]
        with pytest.raises(ManifestsBusy):
            a.hold(200).__enter__()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    with a.hold(1000):
        pass


def test_a_slot_whose_process_id_was_reused_counts_nothing(tmp_path: Path) -> None:
    # Slot 1 names this (running) process, with a start time that is not its own: the process
    # that held the bytes is gone and its id was given to another.
    path = tmp_path / "run" / "manifest-in-flight"
    path.parent.mkdir(parents=True)
    path.write_bytes(struct.pack("<QQQ", 0, 0, 0) + struct.pack("<QQQ", os.getpid(), 1, 900))
    a = flights(tmp_path, 1000)[0]
    with a.hold(1000):
        pass


def test_the_default_budget_takes_two_maximal_manifests_at_once(tmp_path: Path) -> None:
    # The whole server holds about 4.5 times the bytes in flight at its peak (docs/manifests.md):
    # two maximal manifests keep it within 1.5 GiB (bench.manifest_flood); a third waits.
    from server.settings import Settings

    s = Settings(data_dir=tmp_path)
    flight = InFlight(s.run_dir / "manifest-in-flight", s.manifest_bytes_in_flight)
    with (flight.hold(s.max_manifest_bytes), flight.hold(s.max_manifest_bytes),
          pytest.raises(ManifestsBusy)):
        flight.hold(s.max_manifest_bytes).__enter__()
    assert flight.held == 0
