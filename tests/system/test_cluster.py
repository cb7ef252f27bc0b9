"""Several hosts on one PostgreSQL (STAMPD_DISPATCH=database): two API processes and two
worker hosts with separate data directories, on loopback."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text

from formats.jobs import TagJob, decode_job
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
from workers.status import AGENT_PID_FILE


class WorkerHost:
    def __init__(self, data: Path, env: dict[str, str], workers: int = 2) -> None:
        self.runtime = short_tmpdir("wh")
        self.env = {**env, "STAMPD_RUNTIME_DIR": str(self.runtime)}
        self.log = data.parent / f"workerhost-{data.name}.log"
        self.proc = start_stampd(["worker", "--data-dir", str(data), "--workers", str(workers)],
                                 self.env, self.log)

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


def tcp_ports(pid: int) -> list[int]:
    """The local ports of the TCP connections of process ``pid`` (its database connection),
    from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    ports = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


STARTED = re.compile(r"started worker (\d+) \(pid (\d+), key primary, home (\S+)\)")


@dataclass(frozen=True)
class Worker:
    name: str  # <host>:<supervisor PID>:<slot>: a worker started again in its slot has the
    pid: int   # name of the one before (and its heartbeat row keeps that one's PID)
    home: Path


def primary_workers(host: WorkerHost) -> list[Worker]:
    """The primary key's live workers of ``host``: the last start of each slot in its log."""
    slots = {int(i): (int(pid), Path(home)) for i, pid, home in
             STARTED.findall(host.log.read_text())}
    return [Worker(f"{os.uname().nodename}:{host.proc.pid}:{i}", pid, home)
            for i, (pid, home) in slots.items() if Path(f"/proc/{pid}").exists()]


def kill_a_worker_holding_a_stamp(url: str, host: WorkerHost, tries: int = 10) -> tuple[str, str]:
    """Kill -9 a worker of ``host`` that holds the claim of a tag stamp's job it has not
    answered, and return its name and the stamp's commit: the job must be taken over once the
    worker's heartbeat stops.

    Its agent is stopped first (SIGSTOP): the worker then waits for a signature, holding the
    claim of the job it was signing or of the next one. The claim is looked for after the
    kill, not before: one seen in the jobs table before may be answered while the worker is
    being killed (the answer on its way; before, a test failed so). The worker is stopped and
    killed, and its database connection waited for until the server has closed it, having run
    every statement the worker sent; then a claim it made (``claimed_at``: the worker's clock
    is this machine's) is still claimed only if it was left behind. A worker that held none
    then (the reaper took it back before the look; it held a log commit's job) is replaced by
    its supervisor, and the next is tried."""
    engine = create_engine(url)
    connected = text("SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY(:ports)")
    left = text("SELECT payload FROM jobs WHERE state = 'claimed' AND worker = :w "
                "AND claimed_at <= :killed")

    def working() -> tuple[Worker, int] | None:
        """A worker connected to the database (a new one connects once its key is loaded),
        and its agent."""
        for w in primary_workers(host):
            with contextlib.suppress(OSError, ValueError):
                if tcp_ports(w.pid):
                    return w, int((w.home / AGENT_PID_FILE).read_text())
        return None

    try:
        for _ in range(tries):
            wait_for(lambda: working() is not None, timeout=60, what="a connected worker")
            found = working()
            if found is None:
                continue
            w, agent = found
            try:
                os.kill(agent, signal.SIGSTOP)
                time.sleep(0.2)  # (time to send its next request: a claim taken)
                os.kill(w.pid, signal.SIGSTOP)
                ports = tcp_ports(w.pid)
                killed = time.time()
                os.kill(w.pid, signal.SIGKILL)
            except (ProcessLookupError, FileNotFoundError):
                continue  # (gone meanwhile)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(agent, signal.SIGKILL)
            assert ports, f"worker {w.name} (pid {w.pid}) has no database connection"

            def closed(ports: list[int] = ports) -> bool:
                with engine.connect() as conn:
                    return conn.execute(connected, {"ports": ports}).scalar() == 0

            wait_for(closed, timeout=60, what=f"the database connection of {w.name} closed")
            with engine.connect() as conn:
                jobs = [decode_job(p) for p in
                        conn.execute(left, {"w": w.name, "killed": killed}).scalars()]
            stamps = [job for job in jobs if isinstance(job, TagJob)]
            if stamps:
                return w.name, stamps[0].commit
            wait_for(lambda w=w: any(o.name == w.name and o.pid != w.pid
                                     for o in primary_workers(host)),
                     timeout=60, what=f"worker {w.name} replaced")
    finally:
        engine.dispose()
    raise AssertionError(f"no worker was killed holding a stamp's claim in {tries} tries")


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
        # And kill -9 a worker of the other host while it holds a stamp's job it cannot
        # answer: the job is taken over once its heartbeat stops.
        victim, caught = kill_a_worker_holding_a_stamp(pg_url, hosts[1])
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
        # The stamp the killed worker held was signed by another worker, at a second attempt
        # at least, as the journal records it. (Not the jobs table: its finished rows are
        # deleted a minute after they were queued, and a loaded machine takes that long to get
        # here.)
        with engine.connect() as conn:
            taken_over = conn.execute(text("SELECT state, attempts, worker FROM stamps "
                                           "WHERE commit = :c"), {"c": caught}).one()
        assert taken_over.state == "signed" and taken_over.attempts >= 2, (victim, taken_over)
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
    from formats.keys import TLOG_KEY
    from formats.note import Ed25519Verifier
    from formats.tlog.proof import TlogProof, verify_proof
    from keystore.keyset import ensure_extra_keys, key_dir
    from tests.system.test_tlog import get, post_digest

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
