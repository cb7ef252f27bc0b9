"""`make soak`: two API hosts and their worker hosts on one PostgreSQL, under load.

``python -m bench.soak [--seconds 60] [--concurrency 32] [--worker-hosts 2] [--workers 1]
[--api-processes 1]``

Starts a throwaway PostgreSQL cluster (tests/helpers.py `ThrowawayPostgres`), ``--worker-hosts``
worker hosts (``stampd worker``, the fixed test key, ``--workers`` signing workers each) and two
API hosts (``stampd serve --no-workers``, empty data directories: they serve the keys the worker
hosts registered), all with ``STAMPD_DISPATCH=database`` on one database. Then one wrk per API
host, ``--concurrency`` connections each, sends Zeitgitter tag stamps for ``--seconds``
(bench/soak.lua: a commit id of its own per request, every status counted, the commit id of
every good answer written down). It prints requests, non-200 answers by status, throughput,
p50/p99 per API host and the resident memory (RSS) of every server process at the start, at the
end and its peak (sampled every 5 s), so that a long run shows growth.

Then it waits until the log writer has committed every signed stamp and checks that every
stamp answered 200 is in the journal as ``signed`` and in the log's ``hashes.log``.

Exit status 0 if every answer was a good 200 and every one is journaled and logged, 1 if not, 2
if the soak could not run. Every process it starts is stopped by PID (SIGTERM, wait, SIGKILL),
also after an error or Ctrl-C; then anything left that mentions its directory.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from bench.procs import (
    BenchError,
    ensure_wrk,
    keep_or_remove,
    kill_pids,
    process_table,
    progress,
    sweep,
)
from server import db
from tests.helpers import (
    ROOT,
    Server,
    ThrowawayPostgres,
    logged_hashes,
    postgres_bindir,
    seed_data_dir,
    start_server,
    terminate,
)
from workers.pool import POOL_NAME
from workers.worker import WORKER_NAME

LUA = Path(__file__).resolve().parent / "soak.lua"
RSS_EVERY = 5.0  # seconds between RSS samples during the load


@dataclass
class WorkerHost:
    """``stampd worker`` with a data directory of its own holding the test key."""

    name: str
    data: Path
    runtime: Path
    proc: subprocess.Popen[bytes]

    @classmethod
    def start(cls, name: str, root: Path, env: dict[str, str], workers: int) -> WorkerHost:
        data = seed_data_dir(root / name / "data")
        runtime = root / name / "run"  # (short: the bench directory is /tmp/sk...)
        runtime.mkdir(mode=0o700)
        with open(root / name / "worker.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stampd", "worker", "--data-dir", str(data),
                 "--workers", str(workers)],
                env={**env, "STAMPD_RUNTIME_DIR": str(runtime)}, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
        return cls(name, data, runtime, proc)

    def stop(self) -> None:
        terminate(self.proc)
        sweep(self.runtime, self.name)  # workers and agents that outlived their supervisor


# -- memory ----------------------------------------------------------------------------------

def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def label(cmdline: bytes, name: str = "") -> str:
    """What a process is, from its command line; the forked HTTP manager, HTTP processes and
    workers (which keep their parent's command line) by their ``name`` (/proc/PID/comm)."""
    if name in ("stampd-api", POOL_NAME, WORKER_NAME) or name.startswith("stampd-http-"):
        return name
    argv = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    if not argv:
        return "?"
    exe = os.path.basename(argv[0])
    if exe.startswith("python") and len(argv) > 2 and argv[1] == "-m":
        mod = argv[2]
        if mod == "stampd" and len(argv) > 3:
            return f"stampd {argv[3]}"
        return mod
    return exe


def tree(root: int) -> list[tuple[int, str]]:
    """``root`` and its descendants (pid, label), parents first."""
    table = process_table()
    out: list[tuple[int, str]] = []
    todo = [root]
    while todo:
        pid = todo.pop(0)
        if pid in table:
            out.append((pid, label(table[pid].cmdline, table[pid].comm)))
            todo += sorted(p for p, info in table.items() if info.ppid == pid)
    return out


@dataclass
class Memory:
    """RSS of every server process: at the start, the peak of the samples, at the end."""

    roles: dict[int, str] = field(default_factory=dict)
    start: dict[int, int] = field(default_factory=dict)
    peak: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)

    def sample(self, roots: dict[str, int], last: bool = False) -> None:
        for role, root in roots.items():
            for pid, what in tree(root):
                kib = rss_kib(pid)
                if kib is None:
                    continue
                self.roles.setdefault(pid, f"{role}: {what}")
                self.start.setdefault(pid, kib)  # (a process started later: its first sample)
                self.peak[pid] = max(self.peak.get(pid, 0), kib)
                if last:
                    self.end[pid] = kib

    def lines(self) -> list[str]:
        out = [f"{'process':44} {'pid':>7} {'start MiB':>10} {'end MiB':>9} {'peak MiB':>9}"
               f" {'growth':>8}"]
        for pid, role in self.roles.items():
            start, end = self.start.get(pid, 0), self.end.get(pid)
            out.append(f"{role[:44]:44} {pid:>7} {start / 1024:>10.1f} "
                       + (f"{end / 1024:>9.1f}" if end is not None else f"{'gone':>9}")
                       + f" {self.peak.get(pid, 0) / 1024:>9.1f} "
                       + (f"{(end - start) / 1024:>+8.1f}" if end is not None else ""))
        return out


# -- load --------------------------------------------------------------------------------------

@dataclass
class Wrk:
    api: Server
    prefix: str
    ids_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    result: dict[str, Any] = field(default_factory=dict)

    def start(self, seconds: int, conns: int) -> None:
        self.ids_dir.mkdir(parents=True)
        self.proc = subprocess.Popen(
            ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "10s", "-s", str(LUA),
             self.api.url, "--", self.prefix, f"{self.ids_dir}/"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def finish(self, deadline: float) -> None:
        assert self.proc is not None
        try:
            out, err = self.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as e:
            raise BenchError("wrk ran past its time") from e
        text_out = out.decode(errors="replace")
        line = next((ln for ln in text_out.splitlines() if ln.startswith("SOAK-RESULT ")),
                    None)
        if self.proc.returncode != 0 or line is None:
            raise BenchError(f"wrk failed ({self.proc.returncode}): {text_out[-500:]}"
                             f"{err.decode(errors='replace')[-500:]}")
        self.result = json.loads(line.split(" ", 1)[1])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_pids([self.proc.pid], "wrk")
            self.proc.wait(timeout=10)

    def good_ids(self) -> set[str]:
        ids: set[str] = set()
        for f in self.ids_dir.glob("*.ids"):
            ids.update(f.read_text().split())
        return ids

    @property
    def errors(self) -> int:
        r = self.result
        return int(r["connect"] + r["read"] + r["write"] + r["timeout"])


# -- checks afterwards ------------------------------------------------------------------------

def unpublished(engine: Engine) -> int:
    """Stamps signed or pending that no committed log commit holds yet."""
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM stamps s LEFT JOIN log_commits l ON l.id = s.log_commit_id "
            "WHERE s.state IN ('signed', 'pending', 'orphaned') "
            "AND (l.id IS NULL OR l.state <> 'committed')")).scalar_one())


def journal_states(engine: Engine, prefixes: list[str]) -> dict[str, str]:
    """commit id -> state of every stamp of this soak."""
    out: dict[str, str] = {}
    with engine.connect() as conn:
        for p in prefixes:
            for commit, state in conn.execute(text(
                    "SELECT commit, state FROM stamps WHERE commit LIKE :p"), {"p": p + "%"}):
                out[commit] = state
    return out


def log_lines(paths: list[Path], needles: tuple[str, ...]) -> dict[str, int]:
    counts = dict.fromkeys(needles, 0)
    for path in paths:
        try:
            content = path.read_text(errors="replace")
        except OSError:
            continue
        for n in needles:
            counts[n] += content.count(n)
    return counts


def heartbeats(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM worker_heartbeats "
            "WHERE last_seen > extract(epoch from now()) - 5")).scalar_one())


def wait_until(predicate: Any, bound: float, what: str) -> None:
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"gave up waiting ({bound:.0f} s) for {what}")
        time.sleep(0.5)


# -- the soak ---------------------------------------------------------------------------------

def soak(args: argparse.Namespace, root: Path) -> int:
    bindir = postgres_bindir()
    if bindir is None:
        raise BenchError("PostgreSQL server binaries are required (apt-get install postgresql)")
    ensure_wrk()
    pg = ThrowawayPostgres(bindir)
    hosts: list[WorkerHost] = []
    apis: list[Server] = []
    loads: list[Wrk] = []
    engine: Engine | None = None
    try:
        progress("starting PostgreSQL")
        pg.start()
        import psycopg

        with psycopg.connect(pg.admin_url, autocommit=True, connect_timeout=10) as c:
            c.execute('CREATE DATABASE "stampd_soak"')
        url = f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/stampd_soak"
        engine = db.make_engine(url)
        db.upgrade(engine)
        # (RFC 3161 off unless asked for, as with every server the tests and benches start:
        # the worker hosts' key stores hold only the test key.)
        env = {**os.environ, "STAMPD_DISPATCH": "database", "STAMPD_DATABASE_URL": url,
               "STAMPD_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1",
               "STAMPD_TSA": os.environ.get("STAMPD_TSA", "false"),
               "STAMPD_TLOG": os.environ.get("STAMPD_TLOG", "off")}
        total_workers = args.worker_hosts * args.workers
        progress(f"starting {args.worker_hosts} worker hosts x {args.workers} workers")
        hosts = [WorkerHost.start(f"w{i + 1}", root, env, args.workers)
                 for i in range(args.worker_hosts)]
        wait_until(lambda: heartbeats(engine) >= total_workers, 90,
                   f"{total_workers} worker heartbeats")
        progress("starting 2 API hosts (stampd serve --no-workers)")
        for i in range(2):
            (root / f"api{i + 1}" / "run").mkdir(parents=True, mode=0o700)
        apis = [start_server(root / f"api{i + 1}" / "data", workers=0,
                             commit_interval=args.commit_interval, database_url=url,
                             extra_env={"STAMPD_DISPATCH": "database"}, wait=False,
                             runtime_dir=root / f"api{i + 1}" / "run",
                             args=("--no-workers",), api_processes=args.api_processes)
                for i in range(2)]
        for api in apis:
            api.wait_ready(workers=total_workers)

        roots = {f"api{i + 1}": api.proc.pid for i, api in enumerate(apis)}
        roots.update({h.name: h.proc.pid for h in hosts})
        mem = Memory()
        mem.sample(roots)
        nonce = secrets.token_hex(5)
        loads = [Wrk(api, f"{nonce}{i:012x}", root / f"ids{i + 1}")
                 for i, api in enumerate(apis)]
        progress(f"load: {len(loads)} x wrk -c{args.concurrency} for {args.seconds} s")
        for load in loads:
            load.start(args.seconds, args.concurrency)
        deadline = time.monotonic() + args.seconds + 60
        while any(ld.proc is not None and ld.proc.poll() is None for ld in loads):
            mem.sample(roots)
            if time.monotonic() > deadline:
                break
            time.sleep(min(RSS_EVERY, max(0.1, deadline - time.monotonic())))
        mem.sample(roots, last=True)
        for load in loads:
            load.finish(deadline)

        progress("waiting for the log writer to publish every signed stamp")
        wait_until(lambda: unpublished(engine) == 0, args.settle, "the log commit")
        states = journal_states(engine, [ld.prefix for ld in loads])
        writer = [api for api in apis if logged_hashes(api.data_dir)]
        in_log = set().union(*(logged_hashes(api.data_dir) for api in writer))
        return report(args, loads, mem, states, in_log, len(writer),
                      log_lines([api.log_path for api in apis]
                                + [h.data.parent / "worker.log" for h in hosts],
                                ("running it again", "deadlock", "Traceback", " ERROR ")))
    finally:
        for load in loads:
            load.stop()
        for api in apis:
            api.stop()
        for h in hosts:
            h.stop()
        if engine is not None:
            engine.dispose()
        pg.stop()


def report(args: argparse.Namespace, loads: list[Wrk], mem: Memory, states: dict[str, str],
           in_log: set[str], writers: int, logs: dict[str, int]) -> int:
    ok = True
    print(f"soak: 2 API hosts, {args.worker_hosts} worker hosts x {args.workers} workers, "
          f"PostgreSQL; wrk -c{args.concurrency} per API host for {args.seconds} s")
    print(f"{'API host':9} {'requests':>9} {'200':>9} {'non-200':>8} {'errors':>7} "
          f"{'stamps/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}  non-200 by status")
    total_req = total_good = total_bad = 0
    rate = 0.0
    for i, ld in enumerate(loads):
        r = ld.result
        non200 = sum(int(n) for n in r["non200"].values()) + int(r["wrong_body"])
        secs = r["duration_us"] / 1e6
        rate += r["good"] / secs
        total_req += r["requests"]
        total_good += r["good"]
        total_bad += non200 + ld.errors
        by_status = ", ".join(f"{s}: {n}" for s, n in sorted(r["non200"].items())) or "-"
        if r["wrong_body"]:
            by_status += f", 200 with a wrong body: {r['wrong_body']}"
        print(f"api{i + 1:<6} {r['requests']:>9} {r['good']:>9} {non200:>8} {ld.errors:>7} "
              f"{r['good'] / secs:>9.0f} {r['p50_us'] / 1000:>7.1f} {r['p99_us'] / 1000:>7.1f} "
              f"{r['max_us'] / 1000:>7.1f}  {by_status}")
        if r["first_bad"]:
            print(f"          first bad answer: {r['first_bad']}")
    print(f"{'total':9} {total_req:>9} {total_good:>9} {total_bad:>8} {'':>7} {rate:>9.0f}")
    print()
    print("resident memory (RSS) of the server processes:")
    for line in mem.lines():
        print("  " + line)
    print()
    good = set().union(*(ld.good_ids() for ld in loads))
    signed = {c for c, s in states.items() if s == "signed"}
    not_signed = good - signed
    not_logged = good - in_log
    print(f"journal: {len(states)} stamps of this soak, {len(signed)} signed "
          f"({len(signed) - len(good)} more than answered 200: answers wrk did not wait for "
          f"at the end), other states: "
          + (", ".join(f"{s}: {n}" for s, n in sorted(_count(states.values()).items())
                       if s != "signed") or "none"))
    print(f"answered 200: {len(good)}; not journaled as signed: {len(not_signed)}; "
          f"not in the log: {len(not_logged)} (log writers: {writers})")
    print("server logs: " + ", ".join(f"{n!r}: {c}" for n, c in logs.items()))
    if len(good) != total_good:
        print(f"FAIL: {total_good} good answers counted but {len(good)} commit ids written down")
        ok = False
    if total_bad:
        print(f"FAIL: {total_bad} answers were not a good 200 (or requests failed)")
        ok = False
    if not_signed or not_logged:
        print(f"FAIL: answered 200 but not signed in the journal: {sorted(not_signed)[:5]}, "
              f"not in the log: {sorted(not_logged)[:5]}")
        ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60, help="seconds of load (60)")
    ap.add_argument("--concurrency", type=int, default=32,
                    help="connections per API host (32)")
    ap.add_argument("--worker-hosts", type=int, default=2, help="worker hosts (2)")
    ap.add_argument("--workers", type=int, default=1, help="signing workers per worker host (1)")
    ap.add_argument("--api-processes", type=int, default=1,
                    help="HTTP processes of each API host (1)")
    ap.add_argument("--commit-interval", type=float, default=5.0,
                    help="seconds between log commits (5)")
    ap.add_argument("--settle", type=float, default=120.0,
                    help="longest wait for the log commit after the load (120)")
    ap.add_argument("--keep", action="store_true", help="keep the directory (/tmp/sk*)")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="sk", dir="/tmp"))
    code = 2
    try:
        code = soak(args, root)
    except BenchError as e:
        print(f"bench.soak: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    finally:
        sweep(root, "soak")
        keep_or_remove(root, bool(args.keep or code != 0), "server logs, data directories")
    return code


if __name__ == "__main__":
    sys.exit(main())
