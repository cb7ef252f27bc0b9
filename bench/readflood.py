"""`make readflood`: reading the receipts of a much-stamped digest must not slow down stamping.

One ``stampd serve`` (the fixed test key, ``--workers 2``; SQLite, or ``--db postgres`` on a
throwaway cluster). First one digest is stamped ``--copies`` times (4,000; ``POST /v1/stamps``
with the same digest, 16 at a time). Then, with a normal client stamping new digests one at a
time (in a process of its own, client-side latency of each):

1. **baseline** (``--baseline`` s): the normal client alone;
2. **flood** (``--duration`` s): ``--readers`` clients loop on
   ``GET /v1/stamps/sha256/<hex>``, following each page's ``Link: rel="next"`` to the last page
   and starting over (half of them with ``Accept: application/json``, which builds a JSON
   object per receipt; the others the plain concatenated receipts).

Promise: the normal stamp's p99 <= 50 ms in both phases, no stamp failing, every page a 200.
It reports p50/p99/max of the stamps, the read rate (pages, receipts and MB per second) and the
pages' own latency.

Exit status 1 if a promise was broken, 2 if the proof could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.proof_client import normal_client
from bench.proof_http import Conn, HttpError, Latencies, StampRequest
from bench.proof_server import ProofError, ProofServer, database, progress, run_proof, verdict
from bench.pyspy import py_spy

P99_LIMIT_MS = 50.0



async def seed(port: int, digest: str, copies: int, concurrency: int = 16) -> int:
    """Stamp ``digest`` ``copies`` times; the number of 200s."""
    left = copies
    ok = 0
    req = StampRequest("digest", digest)

    async def client() -> None:
        nonlocal left, ok
        conn = Conn(port, timeout=60)
        try:
            while left > 0:
                left -= 1
                try:
                    answer = await req.send(conn)
                except HttpError:
                    await asyncio.sleep(0.1)
                    continue
                if answer.status == 200 and req.answered_right(answer):
                    ok += 1
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return ok


@dataclass
class Reads:
    pages: int = 0
    receipts: int = 0
    bytes: int = 0
    walks: int = 0  # complete walks from the first page to the last
    errors: list[str] = field(default_factory=list)
    lat: Latencies = field(default_factory=Latencies)


async def reader(port: int, digest: str, as_json: bool, reads: Reads, stop: asyncio.Event
                 ) -> None:
    conn = Conn(port, timeout=60)
    first = f"/v1/stamps/sha256/{digest}"
    target: str | None = first
    accept = "application/json" if as_json else None
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                answer = await conn.request("GET", target or first, accept=accept)
            except HttpError as e:
                reads.errors.append(str(e))
                await asyncio.sleep(0.1)
                continue
            reads.lat.add(time.perf_counter() - t0)
            if answer.status != 200:
                reads.errors.append(f"{answer.status} {answer.body[:100]!r}")
                target = first
                continue
            reads.pages += 1
            reads.bytes += len(answer.body)
            reads.receipts += (answer.body.count(b'"receipt":') if as_json
                               else answer.body.count(b"-----BEGIN PGP SIGNED MESSAGE-----"))
            link = answer.headers.get("link", "")
            if link.startswith("<") and 'rel="next"' in link:
                target = link[1:link.index(">")]
            else:
                target = first
                reads.walks += 1
    finally:
        conn.close()


async def start_profile(out: Path | None, pid: int, seconds: float
                        ) -> asyncio.subprocess.Process | None:
    """py-spy record of the API process (every thread, idle ones too, their names) during the
    flood, in py-spy's raw (collapsed stack) format: where the event loop waits."""
    if out is None:
        return None
    exe = py_spy()
    if exe is None:
        raise ProofError("--profile needs py-spy: .venv/bin/pip install -e '.[test,bench]'")
    return await asyncio.create_subprocess_exec(
        exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "250", "--idle",
        "--threads", "--nonblocking", "--format", "raw", "-o", str(out),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


async def main_async(args: argparse.Namespace, workdir: Path) -> int:
    digest = secrets.token_hex(32)
    problems: list[str] = []
    with database(args.db) as url:
        ps = ProofServer(args.db, workdir, url, workers=args.workers, commit_interval=3600,
                         env={"STAMPD_LOG_LEVEL": "WARNING"})
        try:
            await asyncio.to_thread(ps.start)
            progress(f"stamping one digest {args.copies} times")
            t0 = time.monotonic()
            seeded = await seed(ps.port, digest, args.copies)
            seed_s = time.monotonic() - t0
            if seeded != args.copies:
                problems.append(f"seeding: {seeded} of {args.copies} stamps answered 200")
            progress(f"baseline {args.baseline} s")
            base_lat, base_fail = await normal_client(ps.port, args.baseline, ("digest",))
            progress(f"flood {args.duration} s: {args.readers} readers")
            reads = Reads()
            stop = asyncio.Event()
            readers = [asyncio.create_task(reader(ps.port, digest, i % 2 == 1, reads, stop))
                       for i in range(args.readers)]
            await asyncio.sleep(0.5)  # the readers are at it before the clock starts
            r0 = (reads.pages, reads.receipts, reads.bytes)
            t1 = time.monotonic()
            spy = await start_profile(args.profile, ps.api_pid, args.duration)
            flood_lat, flood_fail = await normal_client(ps.port, args.duration, ("digest",))
            if spy is not None:
                await spy.wait()
            span = time.monotonic() - t1
            r1 = (reads.pages, reads.receipts, reads.bytes)
            stop.set()
            await asyncio.gather(*readers)
            alive = ps.server is not None and ps.server.proc.poll() is None
        finally:
            await asyncio.to_thread(ps.stop)

    print(f"read flood ({args.db}): one sha256 digest stamped {seeded} times in {seed_s:.1f} s; "
          f"{args.readers} readers paging through its receipts "
          f"(100 a page; half JSON) while a normal client stamps new digests, c=1")
    print(f"{'phase':9} {'stamps':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'failed':>6}")
    for name, lat, fail in (("baseline", base_lat, base_fail), ("flood", flood_lat, flood_fail)):
        print(f"{name:9} {len(lat.seconds):6} {lat.pct(50):7.1f} {lat.pct(99):7.1f} "
              f"{lat.max_ms:7.1f} {len(fail):6}")
        if lat.pct(99) > P99_LIMIT_MS:
            problems.append(f"{name}: stamp p99 {lat.pct(99):.1f} ms > {P99_LIMIT_MS:.0f} ms")
        if not lat.seconds:
            problems.append(f"{name}: no stamp answered")
        problems += [f"{name}: {f}" for f in fail[:5]]
    pages, receipts, nbytes = (b - a for a, b in zip(r0, r1, strict=True))
    print(f"reads: {pages / span:.0f} pages/s, {receipts / span:.0f} receipts/s, "
          f"{nbytes / span / 1e6:.1f} MB/s ({reads.walks} complete walks of "
          f"{-(-seeded // 100)} pages); page latency {reads.lat.summary()}; "
          f"{len(reads.errors)} errors")
    if reads.errors:
        problems += [f"read: {e}" for e in reads.errors[:5]]
    if not pages:
        problems.append("no page was read during the flood")
    return verdict(problems, alive,
                   f"stamp p99 <= {P99_LIMIT_MS:.0f} ms with and without the read flood")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.readflood",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--copies", type=int, default=4000)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--baseline", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--profile", type=Path, metavar="FILE",
                    help="py-spy record the API process during the flood into FILE (raw)")
    ap.add_argument("--keep", action="store_true", help="keep the data directory and log")
    args = ap.parse_args(argv)
    return run_proof("readflood", lambda workdir: main_async(args, workdir), prefix="rf",
                     keep=args.keep)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
