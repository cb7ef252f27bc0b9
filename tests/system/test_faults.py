"""Faults under load: workers, agents and the whole server killed with SIGKILL."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
from collections import Counter
from pathlib import Path

from tests.helpers import (
    TEST_FPR,
    Load,
    Result,
    Server,
    keyring,
    log_commits,
    logged_hashes,
    stamp_tag,
    stamp_time,
    start_server,
    verify_stamps,
    wait_for,
)

CLIENTS = 200


def verify_all(results: list[Result], pubkey: Path, home: Path) -> None:
    """Every result is a 200 with its own commit, and gpg verifies every signature (in
    batches: one gpg process per 200 stamps), made by the test key at the stamp's time."""
    gnupg = keyring(pubkey, home)
    for r in results:
        assert r.status == 200, f"{r.commit}: {r.status} {r.text}"
        assert r.commit in r.text
    verified = verify_stamps([r.text for r in results], gnupg)
    for r, v in zip(results, verified, strict=True):
        assert v.fingerprint == TEST_FPR
        assert v.created == stamp_time(r.text)


ROUNDS = 3  # a kill that lands between two jobs hits none: the load and the kill are repeated
PER_CLIENT = 3  # 600 stamps a round: the kill after 100 leaves 500 queued or in flight


def _kill_under_load(server: Server, victim: str, tmp_path: Path) -> None:
    """Kill one worker (or agent) while 200 clients stamp (3 each), until a kill lands on a job in
    flight (at most `ROUNDS` rounds): every request of every round is answered with a valid
    stamp, and the hit job was signed again by another worker."""
    total = 0
    for round_ in range(ROUNDS):
        load = Load(server.port, clients=CLIENTS, per_client=PER_CLIENT)
        pool = load.run()
        load.wait_done(100)
        pids = server.worker_pids() if victim == "worker" else server.agent_pids()
        assert len(pids) == 2, pids
        os.kill(pids[0], signal.SIGKILL)
        pool.shutdown(wait=True)
        assert len(load.results) == CLIENTS * PER_CLIENT
        total += CLIENTS * PER_CLIENT
        verify_all(load.results, server.data_dir / "keys/pubkey.asc",
                   tmp_path / f"gnupg{round_}")
        server.wait_ready(workers=2)  # the supervisor replaced the worker
        assert pids[0] not in server.worker_pids() + server.agent_pids()
        _status, ready = server.get_json("/readyz")
        if ready["requeued"] >= 1:  # the kill did hit a job in flight
            break
    else:
        raise AssertionError(f"no kill of {ROUNDS} hit a job in flight: {ready}")

    # The journal records how many workers each stamp took: 1, or more for a requeued job.
    def attempts() -> dict[int, int]:
        with sqlite3.connect(server.data_dir / "stampd.sqlite3") as db:
            return dict(db.execute("SELECT attempts, count(*) FROM stamps "
                                   "WHERE state = 'signed' GROUP BY attempts").fetchall())

    wait_for(lambda: sum(attempts().values()) == total, timeout=30,
             what="every outcome recorded")
    recorded = attempts()
    assert 0 not in recorded and recorded.get(1, 0) > 0, recorded
    assert sum(n for a, n in recorded.items() if a >= 2) >= 1, recorded


def test_kill_worker_under_load(seeded_dir: Path, server_factory: list[Server],
                                tmp_path: Path) -> None:
    server = start_server(seeded_dir, workers=2, api_processes=2)
    server_factory.append(server)
    _kill_under_load(server, "worker", tmp_path)


def test_kill_agent_under_load(seeded_dir: Path, server_factory: list[Server],
                               tmp_path: Path) -> None:
    server = start_server(seeded_dir, workers=2, api_processes=2)
    server_factory.append(server)
    _kill_under_load(server, "agent", tmp_path)


def test_kill_server_under_load_then_restart(seeded_dir: Path, server_factory: list[Server],
                                             tmp_path: Path) -> None:
    server = start_server(seeded_dir, workers=2, commit_interval=3600, api_processes=2)
    server_factory.append(server)
    load = Load(server.port, clients=CLIENTS, per_client=1000)
    pool = load.run()
    load.wait_done(300)
    server.kill9()
    load.stop.set()
    pool.shutdown(wait=True)
    received = [r for r in load.results if r.status == 200]
    assert len(received) >= 300
    verify_all(received[:50], seeded_dir / "keys/pubkey.asc", tmp_path / "gnupg")
    # The orphaned supervisor, workers and agents notice and go away by themselves.
    assert server.reap_leftovers(grace=10) == []

    with sqlite3.connect(seeded_dir / "stampd.sqlite3") as db:
        journaled = {row[0] for row in db.execute('select "commit" from stamps')}
    missing = [r.commit for r in received if r.commit not in journaled]
    assert not missing, f"{len(missing)} received stamps not in the journal"

    # Stamps the kill left pending (signed and answered, the outcome not yet recorded) are
    # published once no live request can be behind them any more: the request timeout plus a
    # grace after their time. A short timeout for the new process keeps that wait short (the
    # process that made them is long dead).
    again = start_server(seeded_dir, workers=2, commit_interval=2,
                         extra_env={"STAMPD_REQUEST_TIMEOUT": "2"})
    server_factory.append(again)

    def not_logged() -> list[str]:
        logged = logged_hashes(seeded_dir)
        return [r.commit for r in received if r.commit not in logged]

    with contextlib.suppress(AssertionError):
        wait_for(lambda: not not_logged(), timeout=60, what="every received stamp in the log")
    missing = not_logged()
    assert not missing, f"{len(missing)} received stamps not in the log"
    assert log_commits(seeded_dir)
    # ... and their rows say so: a stamp published without an outcome is `orphaned`, not
    # `pending` for ever.
    with sqlite3.connect(seeded_dir / "stampd.sqlite3") as db:
        state = dict(db.execute('select "commit", state from stamps'))
    assert {state[r.commit] for r in received} <= {"signed", "orphaned"}, \
        Counter(state[r.commit] for r in received)


def test_kill_the_log_writing_http_process_under_load(
        seeded_dir: Path, server_factory: list[Server], tmp_path: Path) -> None:
    """Of two HTTP processes, kill -9 the one that writes the log while clients stamp: the
    server restarts it, the other takes the log over, and every stamp that was answered is
    journalled and published. Requests on the killed process's connections get no answer
    (as with a server killed) and nothing else fails. (600 stamps, the kill after 300: half
    the load is still to come when the writer dies.)"""
    server = start_server(seeded_dir, workers=2, commit_interval=1, api_processes=2,
                          extra_env={"STAMPD_REQUEST_TIMEOUT": "2"})
    server_factory.append(server)
    writer_line = re.compile(r"this process \(pid (\d+)\) is now the log writer")
    wait_for(lambda: writer_line.search(server.log()), timeout=10, what="a log writer")
    found = writer_line.search(server.log())
    assert found is not None
    writer = int(found.group(1))
    assert writer in server.http_pids()

    load = Load(server.port, clients=20, per_client=30)  # the kill after 300 of 600
    pool = load.run()
    load.wait_done(300)
    os.kill(writer, signal.SIGKILL)
    pool.shutdown(wait=True)
    received = [r for r in load.results if r.status == 200]
    assert len(received) >= 300
    assert all(r.status in (200, 0) for r in load.results), \
        {r.status for r in load.results}
    verify_all(received[:100], seeded_dir / "keys/pubkey.asc", tmp_path / "gnupg")

    server.wait_ready(workers=2)  # both HTTP processes serve again (/readyz checks each)
    assert writer not in server.http_pids() and len(server.http_pids()) == 2
    with sqlite3.connect(seeded_dir / "stampd.sqlite3") as db:
        journaled = {row[0] for row in db.execute('select "commit" from stamps')}
    assert not [r.commit for r in received if r.commit not in journaled]
    # The new writer publishes them all: the killed process's pending ones once no live
    # request can be behind them (the request timeout plus a grace).
    wait_for(lambda: {r.commit for r in received} <= logged_hashes(seeded_dir), timeout=60,
             what="every answered stamp in the log")
    assert len(writer_line.findall(server.log())) == 2


def test_the_worker_supervisor_killed_is_started_again(seeded_dir: Path,
                                                       server_factory: list[Server]) -> None:
    """kill -9 of the worker supervisor: its workers go with it, `stampd serve` starts another
    (the restart policy, `procs.restarts`), whose workers sign the next stamps."""
    server = start_server(seeded_dir, workers=1)
    server_factory.append(server)
    assert "a" * 40 in stamp_tag(server, "a" * 40)
    (pool,), workers = server.signing_tree()
    os.kill(pool, signal.SIGKILL)
    wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in [pool, *workers]),
             timeout=30, what="the supervisor's workers gone with it")
    wait_for(lambda: len(server.signing_tree()[0]) == 1 and len(server.worker_pids()) == 1,
             timeout=60, what="a new supervisor and its worker")
    server.wait_ready()
    assert "b" * 40 in stamp_tag(server, "b" * 40)
    assert re.search(r"worker supervisor exited with -9 after [0-9.]+s; restarting it in "
                     r"[0-9.]+s", server.log_path.read_text())
    assert server.stop() == 0, server.log()
