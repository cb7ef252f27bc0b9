"""`python -m bench.longpoll`: proof waiters must not slow down stamping (issue 38).

One ``stampd serve`` (the fixed test key, ``--workers 2``, the transparency log on; SQLite),
and a normal client stamping new digests one at a time in a process of its own (client-side
latency of each), in three phases:

1. **baseline** (``--baseline`` s): the normal client alone;
2. **abandoned** (``--duration`` s): ``--waiters`` (2,000) requests
   ``GET /v1/proofs/git/<unknown id>?wait=60``, each on a connection of its own, each abandoned
   (the connection closed) after 1 s; they go out at once when the phase starts and again
   every ``--every`` s;
3. **stalled** (``--duration`` s): the log key's worker is stopped (SIGSTOP), so no checkpoint
   can be signed; ``--waiters`` digests are stamped, and a waiter per stamp asks
   ``GET /v1/proofs/<serial>?wait=60`` and holds on. Then the worker goes on (SIGCONT): every
   waiter must get its proof (200) once a checkpoint covers it.

The server's per-client limits on waiters are raised for the run (``STAMPD_PROOF_WAITERS``,
``STAMPD_PROOF_WAITERS_PER_CLIENT``): every waiter comes from 127.0.0.1, and the point is what
waiters cost when they are let in. Beyond those limits a waiter is answered 503 at once.

Promise: the normal stamp's p50 <= 50 ms and p99 <= 500 ms in every phase, none failing; in
the stalled phase every waiter answered with its proof once the log key signs again. It
reports p50/p99/max per phase, the answers the waiters got, and the HTTP process's RSS (idle,
highest seen, after).

Exit status 1 if a promise was broken, 2 if the proof could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from bench.proof_client import normal_client
from bench.proof_http import Conn, HttpError, Latencies, StampRequest, raise_nofile
from bench.proof_server import TLOG_KEY_ID, ProofServer, progress, run_proof, verdict

P50_LIMIT_MS = 50.0
P99_LIMIT_MS = 500.0
HOLD = 1.0  # seconds an abandoned waiter holds on before it closes its connection


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def abandoned(port: int, target: str, hold: float, answers: Counter[str]) -> None:
    """One waiter that sends its request and closes the connection after ``hold`` seconds
    (or when an answer came first: its status is counted)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
    except (OSError, TimeoutError) as e:
        answers[f"connect {type(e).__name__}"] += 1
        return
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        try:
            line = await asyncio.wait_for(reader.readline(), hold)
        except TimeoutError:
            answers["abandoned"] += 1
            return
        except OSError as e:
            answers[type(e).__name__] += 1
            return
        parts = line.split()
        answers[parts[1].decode() if len(parts) > 1 else "closed"] += 1
    finally:
        writer.close()


async def held(port: int, serial: str, answers: Counter[str]) -> None:
    """A waiter that holds on until its answer (at most 70 s)."""
    conn = Conn(port, timeout=70)
    try:
        answer = await conn.request("GET", f"/v1/proofs/{serial}?wait=60")
        answers[str(answer.status)] += 1
    except HttpError as e:
        answers[f"error {e}"[:40]] += 1
    finally:
        conn.close()


async def stamp_digests(port: int, count: int, concurrency: int = 16) -> list[str]:
    """Stamp ``count`` new digests; their serials (X-Stampd-Serial)."""
    serials: list[str] = []
    left = count

    async def client() -> None:
        nonlocal left
        conn = Conn(port, timeout=60)
        try:
            while left > 0:
                left -= 1
                req = StampRequest.new("digest")
                try:
                    answer = await req.send(conn)
                except HttpError:
                    continue
                serial = re.search(rb"\nserial: (\d+)\r?\n", answer.body)
                if answer.status == 200 and serial:
                    serials.append(serial.group(1).decode())
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return serials


class Rss:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.idle = rss_mib(pid)
        self.peak = self.idle

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)


async def main_async(args: argparse.Namespace, workdir: Path) -> int:
    problems: list[str] = []
    raise_nofile(4 * args.waiters + 1024)
    limits = {"STAMPD_PROOF_WAITERS": str(4 * args.waiters),
              "STAMPD_PROOF_WAITERS_PER_CLIENT": str(4 * args.waiters)}
    ps = ProofServer("sqlite", workdir, None, workers=args.workers, commit_interval=3600,
                     env=limits, tlog=True)
    phases: list[tuple[str, Latencies, list[str], Counter[str]]] = []
    try:
        await asyncio.to_thread(ps.start)
        rss = Rss(ps.api_pid)
        stop_rss = asyncio.Event()
        watching = asyncio.create_task(rss.watch(stop_rss))
        progress(f"baseline {args.baseline} s")
        lat, fail = await normal_client(ps.port, args.baseline, ("digest",))
        phases.append(("baseline", lat, fail, Counter()))

        progress(f"abandoned {args.duration} s: {args.waiters} waiters for unknown git ids, "
                 f"each abandoned after {HOLD:g} s, every {args.every:g} s")
        answers: Counter[str] = Counter()

        async def waves() -> None:
            end = time.monotonic() + args.duration
            while time.monotonic() < end:
                t0 = time.monotonic()
                await asyncio.gather(*(
                    abandoned(ps.port, f"/v1/proofs/git/{secrets.token_hex(20)}?wait=60",
                              HOLD, answers) for _ in range(args.waiters)))
                await asyncio.sleep(max(0.0, args.every - (time.monotonic() - t0)))

        flood = asyncio.create_task(waves())
        lat, fail = await normal_client(ps.port, args.duration, ("digest",))
        await flood
        phases.append(("abandoned", lat, fail, answers))

        progress(f"stalled {args.duration} s: the log key's worker stopped, {args.waiters} "
                 "waiters for new stamps")
        log_workers = ps.key_worker_pids(TLOG_KEY_ID)
        if not log_workers:
            problems.append("no worker of the log key found")
        for pid in log_workers:
            os.kill(pid, signal.SIGSTOP)
        answers = Counter()
        try:
            serials = await stamp_digests(ps.port, args.waiters)
            if len(serials) != args.waiters:
                problems.append(f"stalled: {len(serials)} of {args.waiters} stamps answered")
            waiting = [asyncio.create_task(held(ps.port, s, answers)) for s in serials]
            lat, fail = await normal_client(ps.port, args.duration, ("digest",))
        finally:
            for pid in log_workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        progress("the log key's worker goes on; the waiters get their proofs")
        await asyncio.gather(*waiting)
        phases.append(("stalled", lat, fail, answers))
        if answers["200"] != len(serials):
            problems.append(f"stalled: {answers['200']} of {len(serials)} waiters got their "
                            f"proof ({dict(answers)})")
        await asyncio.sleep(2)
        stop_rss.set()
        await watching
        after = rss_mib(ps.api_pid)
        alive = ps.server is not None and ps.server.proc.poll() is None
    finally:
        await asyncio.to_thread(ps.stop)

    print(f"long polls (sqlite, {args.workers} workers): {args.waiters} proof waiters beside a "
          "normal client stamping new digests, c=1")
    print(f"{'phase':9} {'stamps':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>8} {'failed':>6}  "
          "waiters' answers")
    for name, lat, fail, got in phases:
        print(f"{name:9} {len(lat.seconds):6} {lat.pct(50):7.1f} {lat.pct(99):7.1f} "
              f"{lat.max_ms:8.1f} {len(fail):6}  {dict(got) or '-'}")
        if lat.pct(50) > P50_LIMIT_MS:
            problems.append(f"{name}: stamp p50 {lat.pct(50):.1f} ms > {P50_LIMIT_MS:.0f} ms")
        if lat.pct(99) > P99_LIMIT_MS:
            problems.append(f"{name}: stamp p99 {lat.pct(99):.1f} ms > {P99_LIMIT_MS:.0f} ms")
        if not lat.seconds:
            problems.append(f"{name}: no stamp answered")
        problems += [f"{name}: {f}" for f in fail[:5]]
    print(f"HTTP process RSS: idle {rss.idle:.0f} MiB, highest {rss.peak:.0f} MiB "
          f"(+{rss.peak - rss.idle:.0f}), after {after:.0f} MiB")
    return verdict(problems, alive, f"stamp p50 <= {P50_LIMIT_MS:.0f} ms and p99 <= "
                   f"{P99_LIMIT_MS:.0f} ms beside {args.waiters} abandoned and "
                   f"{args.waiters} stalled proof waiters; every stalled waiter got its proof")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.longpoll",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--waiters", type=int, default=2000)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--baseline", type=float, default=10.0)
    ap.add_argument("--every", type=float, default=5.0,
                    help="seconds between waves of abandoned waiters")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the data directory and log")
    args = ap.parse_args(argv)
    return run_proof("longpoll", lambda workdir: main_async(args, workdir), prefix="lp",
                     keep=args.keep)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
