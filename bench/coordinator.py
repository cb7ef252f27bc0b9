"""The host's coordinator alone: how many stamps a second it relays, and at what CPU a stamp.

Run from the repository root::

    python -m bench.coordinator                  # 4 client processes, c=16, 64, 256
    python -m bench.coordinator --conns 64 --seconds 10
    python -m bench.coordinator --cores 0 --client-cores 1-15 --clients 12 --workers 32 \
        --conns 256 --conns 1024                 # many cores: the coordinator on a core of its own

Issue 39 asks how far the coordinator (`server.coordinator.Coordinator`: the host's journal on
SQLite, its dispatcher, its budgets) would scale before it is the bottleneck. In a whole
server its CPU is a small part beside the HTTP processes, the workers and their agents, which
on this 2-core machine hold the rate far below where the coordinator would stop it. Here the
coordinator is the real one, in this process (its event loop and its journal's threads, a real
SQLite journal in a fresh directory: every stamp's row committed, fdatasync'd, before its job
goes), and everything around it is as cheap as it can be made:

- ``--clients`` processes play the HTTP processes: each keeps one `CoordinatorLink` (the real
  one) and runs ``--conns / --clients`` tag stamps at a time through the real `Stamper`, as an
  HTTP process's route would (no HTTP: the request is made up, not parsed);
- one process plays ``--workers`` workers: each connects to the coordinator's socket as a
  worker does (`Hello`) and answers every job at once with the same made-up object (no agent,
  no signature), the answers to the jobs read in one turn written in one write.

Each cell: a warm-up second, then ``--seconds`` measured. Printed per cell: stamps answered a
second and their p50/p99 (the clients' view), the coordinator's CPU per stamp (its event
loop's thread, its journal's threads, both: from /proc/self/task), how busy its loop's thread
was, and the rate at which the coordinator would take 60 % of one core at that cost per stamp
(issue 39's bound at 10,000 stamps/s). The clients' and the fake workers' CPU is shown
beside it: on 2 cores they share the machine with the coordinator. The cost per stamp falls
as the rate rises (more frames joined per turn and per write), so the 60 % rate of a cell is
a floor for what the coordinator can carry at that cell's rate, not a ceiling. Exit status 0,
or 2 when the bench could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.procs import BenchError, keep_or_remove, kill_pids, own_cpu, progress, start_bench

ANSWER = "object signed\n"  # what every fake worker answers (the journal takes any object)


# -- the fake workers -------------------------------------------------------------------------

async def _fake_worker(path: str, name: str) -> None:
    from formats.frames import HEADER, decode_frame, frame_size
    from formats.jobs import Hello, Result
    from formats.keys import PRIMARY

    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(Hello(name, os.getpid(), "F" * 40, PRIMARY).frame())
    while True:
        try:
            head = await reader.readexactly(HEADER.size)
        except asyncio.IncompleteReadError:
            return
        out = []
        while True:  # every job already read: answered in one write
            job = decode_frame(await reader.readexactly(frame_size(head)))
            out.append(Result(int(job["id"]), ANSWER, None).frame())
            if len(reader._buffer) < HEADER.size:  # type: ignore[attr-defined]
                break
            head = await reader.readexactly(HEADER.size)
        writer.write(b"".join(out))


async def _workers_main(path: str, n: int) -> None:
    await asyncio.gather(*(_fake_worker(path, f"bench:{os.getpid()}:{i}") for i in range(n)))


# -- the clients: HTTP processes without HTTP -------------------------------------------------

async def _client_main(path: str, conns: int, start: float, end: float) -> dict[str, Any]:
    from formats.keys import PRIMARY, ServedKey
    from server.coordinator import CoordinatorLink, HostDispatcher
    from server.stamping.requests import TagRequest
    from server.stamping.stamper import Stamper

    key = ServedKey(PRIMARY, "openpgp", "F" * 40, "eddsa (ed25519)", "pub", "B <b@x>",
                    primary=True)
    link = CoordinatorLink(Path(path))
    await link.connect()
    async with asyncio.timeout(30):  # (the coordinator tells every process its workers)
        while not link.workers:
            await asyncio.sleep(0.01)
    stamper = Stamper(link, HostDispatcher(link), [key], public_url="http://bench.invalid/",
                      request_timeout=20.0, clock=time.time, at_once=link)
    latencies: list[float] = []
    errors: list[str] = []

    async def one() -> None:
        while (t0 := time.time()) < end:
            try:
                await stamper.stamp(TagRequest(os.urandom(20).hex(), "bench"))
            except Exception as e:  # (counted and shown; the bench goes on)
                errors.append(repr(e))
                continue
            if t0 >= start:
                latencies.append(time.time() - t0)

    await asyncio.gather(*(one() for _ in range(conns)))
    await link.stop()
    return {"latencies": latencies, "errors": errors[:5], "error_count": len(errors)}


# -- the coordinator, here ---------------------------------------------------------------------

def _threads_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, by their Python names (the coordinator's loop:
    ``coordinator``; the journal's: its executor's and ``journal-checkpoint``)."""
    by_name: dict[str, float] = {}
    for thread in threading.enumerate():
        cpu = own_cpu(f"/proc/self/task/{thread.native_id}/stat")
        if cpu is not None:
            by_name[thread.name] = by_name.get(thread.name, 0.0) + cpu
    return by_name


def _proc_cpu(pid: int) -> float:
    cpu = own_cpu(f"/proc/{pid}/stat")
    if cpu is None:
        raise BenchError(f"process {pid} of the bench ended before its CPU was read")
    return cpu


def cpu_set(text: str) -> set[int]:
    """CPUs ``0-3,8``: a set of CPU numbers (`os.sched_setaffinity`)."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _pin(cores: str | None) -> None:
    """This process (and what it starts afterwards) on ``cores``, if given."""
    if cores:
        os.sched_setaffinity(0, cpu_set(cores))


def _prefill(path: Path, rows: int) -> None:
    """``rows`` signed tag stamps already in the journal at ``path`` (random commits and
    object ids, as the indexes of a journal in service hold them), all in the transparency
    log, so that the cell measures a journal of that size."""
    import sqlite3

    started = time.monotonic()
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
            'INSERT INTO stamps (kind, "commit", tagname, stamped_at, state, attempts, worker, '
            "object_id, tlog_index) SELECT 'tag', lower(hex(randomblob(20))), 'v1', "
            "1800000000 + i, 'signed', 1, 'bench', lower(hex(randomblob(20))), i FROM n",
            (rows,))
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    progress(f"journal prefilled with {rows:,} stamps in {time.monotonic() - started:.0f} s "
             f"({path.stat().st_size >> 20} MiB)")


def _cell(root: Path, args: argparse.Namespace, conns: int) -> dict[str, Any]:
    from server import db
    from server.budgets import HostBudgets
    from server.coordinator import Coordinator
    from server.dispatch.socket import SocketDispatcher
    from server.settings import Settings

    run = Path(tempfile.mkdtemp(prefix="c", dir=root))
    url = f"sqlite:///{run / 'stampd.sqlite3'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    engine.dispose()
    if args.rows:
        _prefill(run / "stampd.sqlite3", args.rows)
    settings = Settings(data_dir=run)
    host = Coordinator(run / "serve.sock", lambda: db.make_engine(url),
                       HostBudgets(settings, time.time),
                       lambda: SocketDispatcher(None, max_queue=settings.max_queue,
                                                sign_timeout=settings.sign_timeout,
                                                max_attempts=settings.max_attempts))
    host.start()
    me = [sys.executable, "-m", "bench.coordinator",
          *(["--client-cores", args.client_cores] if args.client_cores else [])]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen([*me, "--role", "workers", "--socket", str(host.socket_path),
                                       "--workers", str(args.workers)]))
        start = time.time() + 2.0 + args.warmup  # (the clients' start and warm-up)
        end = start + args.seconds
        share = [conns // args.clients + (i < conns % args.clients) for i in range(args.clients)]
        clients = [subprocess.Popen(
            [*me, "--role", "client", "--socket", str(host.socket_path), "--conns", str(n),
             "--start", repr(start), "--end", repr(end)], stdout=subprocess.PIPE)
            for n in share if n]
        procs += clients
        time.sleep(max(0.0, start - time.time()))
        threads0, others0 = _threads_cpu(), [_proc_cpu(p.pid) for p in procs]
        time.sleep(max(0.0, end - time.time()))
        threads1, others1 = _threads_cpu(), [_proc_cpu(p.pid) for p in procs]
        results = []
        for c in clients:
            out, _ = c.communicate(timeout=60)
            if c.returncode != 0:
                raise BenchError(f"a client failed (exit {c.returncode})")
            results.append(json.loads(out))
    finally:
        kill_pids([p.pid for p in procs if p.poll() is None], "bench processes")
        for p in procs:
            p.wait(10)
        host.stop()
    lat = sorted(x for r in results for x in r["latencies"])
    if not lat:
        raise BenchError("no stamp was answered in the measured window")
    errors = sum(r["error_count"] for r in results)
    seconds = args.seconds
    cpu = {name: threads1.get(name, 0.0) - threads0.get(name, 0.0) for name in threads1}
    loop = cpu.get("coordinator", 0.0)
    main_thread = threading.main_thread().name
    journal = sum(v for k, v in cpu.items() if k not in ("coordinator", main_thread))
    stamps = len(lat)
    return {"conns": conns, "rate": stamps / seconds, "p50": 1000 * statistics.median(lat),
            "p99": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], "errors": errors,
            "first_errors": [e for r in results for e in r["errors"]][:3],
            "loop_ms": 1000 * loop / stamps, "journal_ms": 1000 * journal / stamps,
            "loop_busy": loop / seconds,
            "workers_ms": 1000 * (others1[0] - others0[0]) / stamps,
            "clients_ms": 1000 * sum(b - a for a, b in zip(others0[1:], others1[1:],
                                                            strict=True)) / stamps}


def _table(cells: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"the coordinator alone: {args.clients} client processes (HTTP processes without "
             f"HTTP), {args.workers} fake workers (answers at once), a SQLite journal; "
             f"{args.seconds} s a cell, {os.cpu_count()} CPUs"
             + (f"; {args.rows:,} stamps in the journal before each" if args.rows else "")
             + (f"; the coordinator on CPUs {args.cores}" if args.cores else "")
             + (f", the rest on {args.client_cores}" if args.client_cores else ""),
             "    c  stamps/s  p50 ms  p99 ms | coordinator CPU ms/stamp: loop  journal  both"
             "  loop busy  60%-of-a-core rate | clients ms/stamp  workers ms/stamp"]
    for c in cells:
        both = c["loop_ms"] + c["journal_ms"]
        at60 = 0.6 * 1000 / both if both else float("inf")
        lines.append(f"{c['conns']:5d}  {c['rate']:8.0f}  {c['p50']:6.1f}  {c['p99']:6.1f} |"
                     f"{'':26}{c['loop_ms']:5.3f}  {c['journal_ms']:7.3f}  {both:5.3f}"
                     f"  {100 * c['loop_busy']:8.0f}%  {at60:18,.0f} | {c['clients_ms']:16.3f}"
                     f"  {c['workers_ms']:16.3f}")
        if c["errors"]:
            lines.append(f"       {c['errors']} stamps failed, e.g. {c['first_errors']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conns", type=int, action="append",
                    help="stamps in flight over all clients (repeatable; 16, 64, 256)")
    ap.add_argument("--clients", type=int, default=4, help="client processes (4)")
    ap.add_argument("--workers", type=int, default=8, help="fake workers (8)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds measured a cell (5)")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds a cell (1)")
    ap.add_argument("--rows", type=int, default=0,
                    help="signed stamps in the journal before a cell (0: an empty journal)")
    ap.add_argument("--cores", help="CPUs of the coordinator (this process), e.g. 0 or 0-1; "
                    "default: every CPU")
    ap.add_argument("--client-cores", help="CPUs of the clients and the fake workers, e.g. "
                    "1-15; default: every CPU")
    ap.add_argument("--role", choices=("workers", "client"), help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        _pin(args.client_cores if args.role else args.cores)
    except (ValueError, OSError) as e:
        print(f"bench.coordinator: cannot pin to those CPUs: {e}", file=sys.stderr)
        return 2
    if args.role == "workers":
        asyncio.run(_workers_main(args.socket, args.workers))
        return 0
    if args.role == "client":
        out = asyncio.run(_client_main(args.socket, args.conns[0], args.start, args.end))
        print(json.dumps(out))
        return 0
    root = start_bench("stampd-coordinator-")
    try:
        cells = []
        for conns in args.conns or [16, 64, 256]:
            progress(f"c={conns}")
            cells.append(_cell(root, args, conns))
        print(_table(cells, args))
    except BenchError as e:
        print(f"bench.coordinator: {e}", file=sys.stderr)
        return 2
    finally:
        keep_or_remove(root, keep=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
