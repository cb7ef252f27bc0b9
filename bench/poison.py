"""`python -m bench.poison`: digest lookups in a poisoned prefix (issue 25's target).

A client can send manifests whose digests all share their first hex digits, so that the receipts
index of that prefix grows by millions of rows. This bench does it on purpose: one ``stampd serve``
(the test key; ``--workers`` 2 and ``--api-processes`` 1 unless told; SQLite in a fresh data
directory, or ``--database-url``; the manifest byte budgets off) takes ``--manifests`` manifests of
``--lines`` digests each, every digest starting with ``--prefix``. Then, for ``--seconds``,
``--clients`` keep-alive clients look up digests of that prefix (each one of the manifests' digests:
the answer names its manifests) while one more client looks up unrelated digests (stamped before,
one receipt each). Every answer is checked: 200 and the digest's manifest or receipt in it.

Printed: the latency of each kind of lookup (p50, p99, max, count), beside the targets (a
lookup in the poisoned prefix <= 20 ms; an unrelated lookup's p99 <= 20 ms under 8 clients).
Exit status 1 if an answer was wrong, 2 if the bench could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from bench.proof_http import Conn, HttpError
from tests.helpers import Server, seed_data_dir, start_server


def poisoned_body(prefix: str, lines: int, rng: random.Random) -> tuple[bytes, list[str]]:
    """``lines`` sha256sum -b lines whose digests all start with ``prefix``; and a sample of
    them to look up."""
    tail = 64 - len(prefix)
    digests = [prefix + rng.randbytes(32).hex()[:tail] for _ in range(lines)]
    body = "".join(f"{d} *f{i}\n" for i, d in enumerate(digests)).encode()
    return body, rng.sample(digests, min(1000, lines))


def post(server: Server, path: str, body: bytes, ctype: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    try:
        conn.request("POST", path, body, {"Content-Type": ctype})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def lookups(port: int, digests: list[str], seconds: float, wrong: list[str],
                  latencies: list[float], rng: random.Random) -> None:
    conn = Conn(port, timeout=30)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            digest = rng.choice(digests)
            t = time.perf_counter()
            try:
                answer = await conn.request("GET", f"/v1/stamps/sha256/{digest}")
            except HttpError as e:
                wrong.append(f"{digest}: {e}")
                continue
            latencies.append(time.perf_counter() - t)
            if answer.status != 200 or (b"manifest: /v1/manifests/" not in answer.body
                                        and f"digest: {digest}".encode() not in answer.body):
                wrong.append(f"{digest}: {answer.status} {answer.body[:120]!r}")
    finally:
        conn.close()


async def load(port: int, poisoned: list[str], unrelated: list[str], clients: int,
               seconds: float, wrong: list[str]) -> tuple[list[float], list[float]]:
    inside: list[float] = []
    outside: list[float] = []
    tasks = [lookups(port, poisoned, seconds, wrong, inside, random.Random(i))
             for i in range(clients)]
    tasks.append(lookups(port, unrelated, seconds, wrong, outside, random.Random(-1)))
    await asyncio.gather(*tasks)
    return inside, outside


def row(name: str, values: list[float], target: str) -> str:
    ms = [v * 1000 for v in values]
    return (f"{name:<28} {percentile(ms, 0.5):>8.2f} {percentile(ms, 0.99):>8.2f} "
            f"{max(ms, default=float('nan')):>8.2f} {len(ms):>8}   {target}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifests", type=int, default=10)
    ap.add_argument("--lines", type=int, default=1_000_000, help="digests per manifest")
    ap.add_argument("--prefix", default="0000", help="hex digits every digest starts with")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--database-url", default=None, help="PostgreSQL (default: SQLite)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--api-processes", type=int, default=1,
                    help="HTTP processes (stampd's own default: one per three CPUs)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bp"))
    env = {"STAMPD_MANIFEST_BYTES_PER_CLIENT_HOUR": "0", "STAMPD_MANIFEST_BYTES_PER_HOUR": "0"}
    try:
        server = start_server(seed_data_dir(tmp / "data"), workers=args.workers, extra_env=env,
                              database_url=args.database_url,
                              api_processes=args.api_processes)
    except Exception as e:  # the bench cannot run: say why in one line
        print(f"bench.poison: the server did not start: {e}", file=sys.stderr)
        return 2
    rng = random.Random(25)
    wrong: list[str] = []
    try:
        unrelated = []
        for _ in range(50):
            digest = rng.randbytes(32).hex()
            status, body = post(server, "/v1/stamps", urllib.parse.urlencode(
                {"sha256": digest}).encode(), "application/x-www-form-urlencoded")
            if status != 200:
                print(f"bench.poison: a digest stamp failed: {status} {body[:200]!r}",
                      file=sys.stderr)
                return 2
            unrelated.append(digest)
        poisoned: list[str] = []
        started = time.monotonic()
        for i in range(args.manifests):
            body, sample = poisoned_body(args.prefix, args.lines, rng)
            status, answer = post(server, "/v1/manifests", body, "text/plain")
            if status != 200:
                print(f"bench.poison: manifest {i + 1} was refused: {status} {answer[:200]!r}",
                      file=sys.stderr)
                return 2
            poisoned += sample
            print(f"manifest {i + 1}/{args.manifests}: {args.lines:,} digests of {args.prefix}…, "
                  f"{len(body) / 1e6:.1f} MB, {time.monotonic() - started:.0f} s so far",
                  flush=True)
        inside, outside = asyncio.run(load(server.port, poisoned, unrelated, args.clients,
                                           args.seconds, wrong))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    total = args.manifests * args.lines
    print(f"\n{total:,} digests under prefix {args.prefix} in {args.manifests} manifests; "
          f"{args.clients} clients in the prefix and 1 outside it for {args.seconds:.0f} s; "
          f"{'PostgreSQL' if args.database_url else 'SQLite'}, {os.cpu_count()} CPUs, "
          f"{args.workers} workers, {args.api_processes} HTTP process(es)")
    print(f"{'lookup':<28} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'count':>8}   target")
    print(row(f"in the prefix ({args.clients} clients)", inside, "<= 20 ms"))
    print(row("unrelated (1 client beside)", outside, "p99 <= 20 ms"))
    for w in wrong[:10]:
        print(f"wrong: {w}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
