"""`make slow`: slow and idle clients must not deny service or exhaust file descriptors.

One ``stampd serve`` (SQLite, the fixed test key, ``--workers 2``, default timeouts:
``STAMPD_KEEPALIVE_TIMEOUT`` 15 s, ``STAMPD_BODY_TIMEOUT`` 10 s) started with the soft
``RLIMIT_NOFILE`` a systemd service gets by default (``--server-nofile``, 1024). Then:

1. **baseline** (``--baseline`` s): a normal client stamps alone, one stamp at a time on one
   keep-alive connection, tag and digest stamps in turn; client-side latency of each.
2. **attack** (``--duration`` s) while the normal client goes on: ``--idle`` connections that
   send nothing, ``--slowloris`` connections trickling request headers one byte a second and
   never finishing them, ``--stalled`` connections announcing ``Content-Length: 1000`` and
   sending 10 bytes of body. Each attacker opens a new connection whenever the server closes
   its own, so the attack is kept up throughout.
3. **flood** (``--flood`` idle connections at once, ``--flood-duration`` s; 0 skips it): more
   connections than the server's connection limit (its RLIMIT_NOFILE less a reserve, see
   ``server/runtime/httpproto.py``), which it must enforce by closing the oldest connections
   that have not delivered a request, rather than run out of descriptors.
4. **after**: every attacker is gone; the server's descriptors after a few seconds.

Throughout, the API process's open descriptors (``/proc/<pid>/fd``) are sampled. Promises:
the normal client's p99 <= 50 ms in every phase with no failed stamp; during the attack and
the flood the descriptors never exceed the connection limit + a small constant (``--fd-slack``);
after the attack they are back near the baseline (within ``--fd-slack``). It also reports how
long the server let each kind of attacker connection live (the timeouts at work).

Exit status 1 if a promise was broken, 2 if the proof could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.proof_client import normal_client
from bench.proof_http import Latencies, open_fds, raise_nofile
from bench.proof_server import ProofError, ProofServer, progress, run_proof, verdict
from server.runtime.httpproto import connection_limit

P99_LIMIT_MS = 50.0
CLK_TCK = os.sysconf("SC_CLK_TCK")



@contextlib.contextmanager
def soft_nofile(n: int) -> Iterator[None]:
    """This process's soft RLIMIT_NOFILE is ``n`` inside the block (children started in it
    inherit it), and what it was afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def server_nofile(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise ProofError(f"no open-files limit for pid {pid}")


@dataclass
class Attackers:
    """Connections of one kind, each replaced when the server closes it."""

    kind: str  # idle | slowloris | stalled
    opened: int = 0
    closed_by_server: int = 0
    answered: dict[int, int] = field(default_factory=dict)  # status -> count, before closing
    lifetimes: list[float] = field(default_factory=list)  # seconds, of those the server closed
    connect_errors: int = 0

    def line(self) -> str:
        life = sorted(self.lifetimes)
        med = f"{life[len(life) // 2]:.1f}" if life else "-"
        top = f"{life[-1]:.1f}" if life else "-"
        ans = ",".join(f"{s}:{n}" for s, n in sorted(self.answered.items())) or "-"
        return (f"  {self.kind:9} opened {self.opened:6}  closed by server "
                f"{self.closed_by_server:6} (lifetime median {med} s, max {top} s)  "
                f"answers {ans}  connect errors {self.connect_errors}")


async def _status(first: bytes, reader: asyncio.StreamReader) -> int:
    """The status of an answer whose first byte was ``first`` (0 if it is not HTTP)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        line = first + await reader.readline()
        if line.startswith(b"HTTP/1."):
            return int(line.split()[1])
    return 0


async def attacker(port: int, who: Attackers, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            who.connect_errors += 1
            await asyncio.sleep(0.5)
            continue
        who.opened += 1
        t0 = time.monotonic()
        closed = False
        try:
            if who.kind == "slowloris":
                writer.write(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            elif who.kind == "stalled":
                writer.write(b"POST /v1/stamps HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                             b"application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n"
                             b"\r\nsha256=000")
            while not stop.is_set():
                read = asyncio.ensure_future(reader.read(1))
                stopped = asyncio.ensure_future(stop.wait())
                done, _ = await asyncio.wait({read, stopped}, timeout=1.0,
                                             return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if read in done:
                    data = read.result() if read.exception() is None else b""
                    if data:  # an answer (408, 400...), then the close
                        status = await _status(data, reader)
                        who.answered[status] = who.answered.get(status, 0) + 1
                    closed = True
                    break
                read.cancel()
                if who.kind == "slowloris" and not stop.is_set():
                    writer.write(b"a")  # one more byte of a header that never ends
        except OSError:
            closed = True
        finally:
            writer.close()
        if closed and not stop.is_set():
            who.closed_by_server += 1
            who.lifetimes.append(time.monotonic() - t0)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def own_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    server_cpu: float = 0.0  # seconds of CPU the API process used
    load_cpu: float = 0.0  # seconds of CPU this process (every client) used
    lat: Latencies = field(default_factory=Latencies)
    failures: list[str] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    attackers: list[Attackers] = field(default_factory=list)

    @property
    def fd_max(self) -> int:
        return max(self.fds, default=-1)


async def sample_fds(pid: int, phase_of: list[Phase], stop: asyncio.Event) -> None:
    while not stop.is_set():
        n = open_fds(pid)
        if n >= 0:
            phase_of[0].fds.append(n)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def run_phase(port: int, pid: int, phase: Phase, current: list[Phase], seconds: float,
                    kinds: dict[str, int]) -> None:
    current[0] = phase
    t0, server0, load0 = time.monotonic(), cpu_seconds(pid), own_cpu_seconds()
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    for kind, n in kinds.items():
        who = Attackers(kind)
        phase.attackers.append(who)
        tasks += [asyncio.create_task(attacker(port, who, stop)) for _ in range(n)]
    if kinds:
        await asyncio.sleep(1.0)  # let the attack connect before the clock starts
    phase.lat, phase.failures = await normal_client(port, seconds)
    stop.set()
    await asyncio.gather(*tasks)
    phase.seconds = time.monotonic() - t0
    phase.server_cpu = cpu_seconds(pid) - server0
    phase.load_cpu = own_cpu_seconds() - load0


async def main_async(args: argparse.Namespace, workdir: Path) -> int:
    ps = ProofServer("sqlite", workdir, None, workers=args.workers, commit_interval=60,
                     env={"STAMPD_LOG_LEVEL": "WARNING"})
    try:
        with soft_nofile(args.server_nofile):
            await asyncio.to_thread(ps.start)
        pid = ps.api_pid
        nofile = server_nofile(pid)
        limit = connection_limit(nofile)
        progress(f"server pid {pid}: RLIMIT_NOFILE {nofile}, connection limit {limit}")
        current = [Phase("warm-up")]
        fd_stop = asyncio.Event()
        sampler = asyncio.create_task(sample_fds(pid, current, fd_stop))
        await run_phase(ps.port, pid, current[0], current, 2.0, {})
        phases = [Phase("baseline"), Phase("attack"), Phase("flood")]
        progress(f"baseline {args.baseline} s")
        await run_phase(ps.port, pid, phases[0], current, args.baseline, {})
        progress(f"attack {args.duration} s: {args.idle} idle, {args.slowloris} slowloris, "
                 f"{args.stalled} stalled-body connections")
        await run_phase(ps.port, pid, phases[1], current, args.duration,
                        {"idle": args.idle, "slowloris": args.slowloris,
                         "stalled": args.stalled})
        if args.flood:
            progress(f"flood {args.flood_duration} s: {args.flood} idle connections")
            await run_phase(ps.port, pid, phases[2], current, args.flood_duration,
                            {"idle": args.flood})
        else:
            phases.pop()
        after = Phase("after")
        current[0] = after
        await asyncio.sleep(args.settle)
        fd_stop.set()
        await sampler
        after_fds = open_fds(pid)
        alive = ps.server is not None and ps.server.proc.poll() is None
    finally:
        await asyncio.to_thread(ps.stop)

    baseline_fds = min(phases[0].fds, default=-1)
    problems: list[str] = []
    print(f"slow clients: server RLIMIT_NOFILE {nofile}, connection limit {limit}, "
          f"keep-alive/header timeout 15 s, body timeout 10 s; normal client c=1, tag and "
          f"digest stamps in turn")
    print(f"{'phase':9} {'stamps':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'failed':>6} "
          f"{'fds min':>7} {'fds max':>7} {'server cpu':>10} {'load cpu':>8}")
    for ph in phases:
        print(f"{ph.name:9} {len(ph.lat.seconds):6} {ph.lat.pct(50):7.1f} {ph.lat.pct(99):7.1f} "
              f"{ph.lat.max_ms:7.1f} {len(ph.failures):6} {min(ph.fds, default=-1):7} "
              f"{ph.fd_max:7} {ph.server_cpu / ph.seconds:9.0%} {ph.load_cpu / ph.seconds:8.0%}")
        for who in ph.attackers:
            print(who.line())
        if ph.lat.pct(99) > P99_LIMIT_MS:
            problems.append(f"{ph.name}: p99 {ph.lat.pct(99):.1f} ms > {P99_LIMIT_MS:.0f} ms")
        if not ph.lat.seconds:
            problems.append(f"{ph.name}: no stamp answered")
        problems += [f"{ph.name}: {f}" for f in ph.failures[:5]]
        if ph.name != "baseline" and ph.fd_max > limit + args.fd_slack + baseline_fds:
            problems.append(f"{ph.name}: {ph.fd_max} fds > connection limit {limit} + "
                            f"baseline {baseline_fds} + {args.fd_slack}")
    print(f"fds: baseline {baseline_fds}, during the attack at most {phases[1].fd_max}"
          + (f", during the flood at most {phases[2].fd_max}" if len(phases) > 2 else "")
          + f", {args.settle:.0f} s after {after_fds} "
          f"(bound: limit {limit} + baseline + {args.fd_slack} during, baseline + "
          f"{args.fd_slack} after)")
    if after_fds > baseline_fds + args.fd_slack:
        problems.append(f"after: {after_fds} fds, baseline {baseline_fds}")
    return verdict(problems, alive, f"p99 <= {P99_LIMIT_MS:.0f} ms under attack, descriptors "
                   "bounded and released")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.slow", description=__doc__.split("\n")[0])
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--slowloris", type=int, default=100)
    ap.add_argument("--stalled", type=int, default=100)
    ap.add_argument("--duration", type=float, default=30.0, help="attack seconds (30)")
    ap.add_argument("--baseline", type=float, default=5.0)
    ap.add_argument("--flood", type=int, default=1500,
                    help="idle connections of the flood phase (1500; 0: none)")
    ap.add_argument("--flood-duration", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before 'after' (3)")
    ap.add_argument("--server-nofile", type=int, default=1024,
                    help="the server's soft RLIMIT_NOFILE (1024, systemd's default)")
    ap.add_argument("--fd-slack", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the data directory and log")
    args = ap.parse_args(argv)
    raise_nofile(args.idle + args.slowloris + args.stalled + args.flood + 1024)
    return run_proof("slow", lambda workdir: main_async(args, workdir), prefix="sl",
                     keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
