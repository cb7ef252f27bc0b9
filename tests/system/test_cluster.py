"""Several hosts on one PostgreSQL (STAMPD_DISPATCH=database): two API processes and two
worker hosts with separate data directories, on loopback."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from sqlalchemy import create_engine, text

from server import db
from tests.helpers import (
    TEST_FPR,
    Load,
    Server,
    keyring,
    kill_pids,
    logged_hashes,
    pids_mentioning,
    run_stampd,
    seed_data_dir,
    short_tmpdir,
    start_server,
    start_stampd,
    terminate,
    verify_stamps,
    wait_for,
)


class WorkerHost:
    def __init__(self, data: Path, env: dict[str, str], workers: int = 2) -> None:
        self.runtime = short_tmpdir("wh")
        self.env = {**env, "STAMPD_RUNTIME_DIR": str(self.runtime)}
        self.proc = start_stampd(["worker", "--data-dir", str(data), "--workers", str(workers)],
                                 self.env, data.parent / f"workerhost-{data.name}.log")

    def stop(self) -> None:
        terminate(self.proc)
        kill_pids(pids_mentioning(str(self.runtime)))
        shutil.rmtree(self.runtime, ignore_errors=True)


def heartbeats(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT count(*) FROM worker_heartbeats "
                "WHERE last_seen > extract(epoch from now()) - 5")).scalar_one())
    finally:
        engine.dispose()


def freeze_worker_holding_a_job(url: str, exclude_supervisor: int, tries: int = 300) -> int:
    """SIGSTOP a live worker (not of the given host) while it holds a claimed job, and return
    its PID: killing it then certainly leaves a claimed job behind."""
    import time

    engine = create_engine(url)
    query = text("SELECT h.name, h.pid FROM jobs j JOIN worker_heartbeats h "
                 "ON h.name = j.worker WHERE j.state = 'claimed'")
    held = text("SELECT count(*) FROM jobs WHERE state = 'claimed' AND worker = :w")
    try:
        for _ in range(tries):
            with engine.connect() as conn:
                rows = [r for r in conn.execute(query).all()
                        if f":{exclude_supervisor}:" not in r.name]
            if not rows:
                continue
            name, pid = rows[0]
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.3)  # a statement it had already sent (storing a result) lands first
            with engine.connect() as conn:
                if conn.execute(held, {"w": name}).scalar():
                    return int(pid)
            os.kill(pid, signal.SIGCONT)
    finally:
        engine.dispose()
    raise AssertionError("no worker could be caught holding a claimed job")


def test_two_apis_two_worker_hosts(tmp_path: Path, pg_url: str,
                                   server_factory: list[Server]) -> None:
    base = {**os.environ, "STAMPD_DISPATCH": "database", "STAMPD_DATABASE_URL": pg_url,
            "STAMPD_HEARTBEAT_TIMEOUT": "3", "STAMPD_LOG_LEVEL": "INFO"}
    dirs = [seed_data_dir(tmp_path / f"h{i}" / "data") for i in range(4)]
    hosts = [WorkerHost(dirs[2], base), WorkerHost(dirs[3], base)]
    try:
        # API hosts sign nothing themselves (--no-workers): the 4 workers are the worker
        # hosts'. (Without it each API host started a pool of its own, one worker per CPU, and
        # waiting for exactly 4 heartbeats raced with those pools on a busy machine.)
        apis = [start_server(dirs[i], workers=0, commit_interval=2, database_url=pg_url,
                             extra_env={"STAMPD_DISPATCH": "database",
                                        "STAMPD_HEARTBEAT_TIMEOUT": "3"}, wait=False,
                             args=("--no-workers",), api_processes=2)
                for i in range(2)]
        server_factory.extend(apis)
        wait_for(lambda: heartbeats(pg_url) >= 4, timeout=60, what="4 worker heartbeats")
        for api in apis:
            api.wait_ready(workers=4)

        # Concurrent load through both APIs; one worker host's supervisor is killed mid-load.
        loads = [Load(api.port, clients=20, per_client=30) for api in apis]
        pools = [load.run() for load in loads]
        loads[0].wait_done(60)
        os.kill(hosts[0].proc.pid, signal.SIGKILL)
        # And kill -9 a worker of the other host while it holds a claimed job: the job is
        # taken over once its heartbeat stops.
        victim = freeze_worker_holding_a_job(pg_url, exclude_supervisor=hosts[0].proc.pid)
        os.kill(victim, signal.SIGKILL)
        for p in pools:
            p.shutdown(wait=True)
        results = [r for load in loads for r in load.results]
        assert len(results) == 1200
        gnupg = keyring(dirs[0] / "keys/pubkey.asc", tmp_path / "g")
        bad = [r for r in results if r.status != 200]
        assert not bad, bad[:3]
        for r in results:
            assert r.commit in r.text
        # Every stamp verifies (gpg in batches), not only a sample.
        assert {v.fingerprint for v in verify_stamps([r.text for r in results], gnupg)} == {
            TEST_FPR}
        # Orphaned workers of the killed host exit; nothing was signed twice.
        engine = create_engine(pg_url)

        def job_states() -> dict[str, int]:
            with engine.connect() as conn:
                return dict(conn.execute(text(  # type: ignore[arg-type]
                    "SELECT state, count(*) FROM jobs GROUP BY state")).all())

        # (log commits are signed through jobs too: wait until none is in flight)
        wait_for(lambda: job_states().get("claimed", 0) == 0, timeout=20, what="idle jobs")
        with engine.connect() as conn:
            failed = conn.execute(text("SELECT id, attempts, worker, error, left(payload, 60) "
                                       "FROM jobs WHERE state = 'failed'")).all()
        assert not failed, failed
        with engine.connect() as conn:
            retried = conn.execute(text("SELECT count(*) FROM jobs WHERE attempts > 1")).scalar()
        with engine.connect() as conn:
            dist = conn.execute(text("SELECT state, attempts, count(*) FROM jobs "
                                     "GROUP BY state, attempts")).all()
        assert retried and retried >= 1, (victim, dist)  # signed by another worker
        with engine.connect() as conn:  # the journal records the attempts of each stamp
            unrecorded = conn.execute(text("SELECT count(*) FROM stamps WHERE state = 'signed' "
                                           "AND attempts < 1")).scalar()
            signed = conn.execute(text("SELECT count(*) FROM stamps WHERE state = 'signed'")
                                  ).scalar()
        assert unrecorded == 0 and signed, (unrecorded, signed)
        engine.dispose()

        # Exactly one log writer; kill it, the other takes over with every stamp.
        received = {r.commit for r in results}
        wait_for(lambda: any(received <= logged_hashes(d) for d in dirs[:2]), timeout=30,
                 what="a log commit with every stamp")
        writer = next(i for i in range(2) if logged_hashes(dirs[i]))
        other = 1 - writer
        apis[writer].kill9()
        more = Load(apis[other].port, clients=4, per_client=5)
        more.run().shutdown(wait=True)
        assert all(r.status == 200 for r in more.results)
        new = {r.commit for r in more.results}
        wait_for(lambda: (received | new) <= logged_hashes(dirs[other]), timeout=40,
                 what="the new log writer's commit")
        r = run_stampd(["audit", dirs[other] / "log.git"], timeout=120, cwd=Path.cwd())
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        for h in hosts:
            h.stop()


def test_reaper_requeues_then_fails(pg_url: str) -> None:
    """Claims of a worker whose heartbeat stopped go back to the queue, until max attempts."""
    import time

    from server.dispatch.database import DbDispatcher

    engine = db.make_engine(pg_url)
    now = time.time()
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO worker_heartbeats VALUES ('gone', 'primary', 1, :t, :t)"),
                     {"t": now - 60})
        conn.execute(text("INSERT INTO worker_heartbeats VALUES ('live', 'primary', 2, :t, :t)"),
                     {"t": now})
        for attempts, worker in ((1, "gone"), (3, "gone"), (1, "live")):
            conn.execute(text(
                "INSERT INTO jobs (key_id, payload, state, worker, claimed_at, attempts, "
                "created_at) VALUES ('primary', '{}', 'claimed', :w, :t, :a, :t)"),
                {"w": worker, "t": now, "a": attempts})
    DbDispatcher(engine, max_attempts=3, heartbeat_timeout=10).reap()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT attempts, state, worker, error FROM jobs "
                                 "ORDER BY id")).all()
    engine.dispose()
    assert [tuple(r) for r in rows] == [
        (1, "queued", None, None),
        (3, "failed", "gone", "signing failed too often"),
        (1, "claimed", "live", None),
    ]


def test_reaper_deletes_finished_jobs_after_their_requests(pg_url: str) -> None:
    """Done and failed jobs older than KEEP_FINISHED go (their requests were answered long
    ago); newer ones, and every queued or claimed job, stay."""
    import time

    from server.dispatch.database import KEEP_FINISHED, DbDispatcher

    engine = db.make_engine(pg_url)
    old, new = time.time() - KEEP_FINISHED - 30, time.time() - 5
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs"))
        conn.execute(text("INSERT INTO worker_heartbeats VALUES ('live2', 'primary', 2, :t, :t)"),
                     {"t": time.time()})
        for state, created, worker in (("done", old, None), ("failed", old, None),
                                       ("done", new, None), ("queued", old, None),
                                       ("claimed", old, "live2")):
            conn.execute(text(
                "INSERT INTO jobs (key_id, payload, state, worker, claimed_at, attempts, "
                "created_at) VALUES ('primary', '{}', :s, :w, :now, 1, :t)"),
                {"s": state, "w": worker, "t": created, "now": time.time()})
    DbDispatcher(engine, max_attempts=3, heartbeat_timeout=10).reap()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT state, created_at = :new FROM jobs ORDER BY id"),
                            {"new": new}).all()
    engine.dispose()
    assert [tuple(r) for r in rows] == [("done", True), ("queued", False), ("claimed", False)]


def test_transparency_log_across_hosts(tmp_path: Path, pg_url: str,
                                       server_factory: list[Server]) -> None:
    """Two API hosts and a worker host on one PostgreSQL, the transparency log on: exactly one
    host sequences; the other writes its own tiles from the database and serves the same
    checkpoint and proofs of the stamps made through the first."""
    from formats.note import Ed25519Verifier
    from formats.tlog.proof import TlogProof, verify_proof
    from tests.system.test_tlog import get, post_digest
    from workers.keys.keyset import TLOG_KEY, ensure_extra_keys, key_dir

    env = {"STAMPD_DISPATCH": "database", "STAMPD_HEARTBEAT_TIMEOUT": "3", "STAMPD_TLOG": "on",
           "STAMPD_TLOG_ORIGIN": "stamps.test/tlog"}  # (one origin for the hosts of one log)
    base = {**os.environ, **env, "STAMPD_DATABASE_URL": pg_url, "STAMPD_LOG_LEVEL": "INFO"}
    dirs = [seed_data_dir(tmp_path / f"h{i}" / "data") for i in range(3)]
    # one log key for every host, as an operator copies the keys (docs/transparency.md)
    ensure_extra_keys(dirs[0] / "keys", [TLOG_KEY], "stampd test", None)
    for d in dirs[1:]:
        shutil.copytree(key_dir(dirs[0] / "keys", TLOG_KEY), key_dir(d / "keys", TLOG_KEY))
    host = WorkerHost(dirs[2], base, workers=1)
    try:
        apis = [start_server(dirs[i], workers=0, commit_interval=3600, database_url=pg_url,
                             extra_env=env, wait=False, args=("--no-workers",))
                for i in range(2)]
        server_factory.extend(apis)
        for api in apis:
            api.wait_ready(workers=2)
        serials = [post_digest(apis[0], f"{n:064x}") for n in range(5)]
        proofs = []
        for api in apis:
            vkey = get(api, "/tlog/vkey")[2].decode().strip()
            for serial in serials:
                status, _, proof = get(api, f"/v1/proofs/{serial}?wait=30")
                assert status == 200, proof
                parsed = TlogProof.parse(proof)
                assert parsed.extra is not None
                verify_proof(proof, parsed.extra, origin=vkey.split("+")[0],
                             log_keys=[Ed25519Verifier.from_vkey(vkey)])
                proofs.append(parsed.index)
        assert sorted(set(proofs)) == list(range(5))  # one tree, the same on both hosts
        # each host wrote its own tiles, in its own data directory
        for d in dirs[:2]:
            assert (d / "tlog" / "tile" / "entries").is_dir()
    finally:
        host.stop()
