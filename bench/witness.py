"""stampd as a witness under load (`python -m bench.witness`, part of `make bench`).

One ``stampd serve`` witness (workers as `stampd serve` sizes them on this machine: one per
CPU for the primary key, ``STAMPD_EXTRA_KEY_WORKERS`` (1) for the witness key; SQLite), told
of ``--logs`` logs (each an Ed25519 key of its own, made here with ``cryptography``). Every
log sends a chain of ``--steps`` growing checkpoints (``POST /add-checkpoint``, each from the
size cosigned before, with its consistency proof), the logs all at once, each on its own
keep-alive connection. Every request is built and signed before the clock starts; every
answer must be 200 and one cosignature line (a sample is verified with ``cryptography`` on the
spec's message). Prints cosignatures/s and the p50/p99 latency of a request; the target is at
least 500 cosignatures/s on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from bench.proof_http import Conn
from formats.note import VerifierKey
from tests.helpers import WitnessedLog, seed_data_dir, start_server

TARGET = 500.0  # cosignatures/s on 2 cores


def build(logs: int, steps: int) -> tuple[list[WitnessedLog], list[list[bytes]]]:
    """The logs and, for each, its chain of requests (sizes 1, 3, 6, ...: growing steps)."""
    made, chains = [], []
    for i in range(logs):
        log = WitnessedLog(f"bench.example/log-{i}", leaves=steps * (steps + 1) // 2 + 1)
        old, chain = 0, []
        for step in range(1, steps + 1):
            new = old + step
            chain.append(log.request(old, new))
            old = new
        made.append(log)
        chains.append(chain)
    return made, chains


async def drive(port: int, chains: list[list[bytes]]
                ) -> tuple[float, list[float], list[list[bytes]]]:
    """(seconds, latencies, each chain's answers): every chain at once, each on its own
    keep-alive connection (`bench.proof_http.Conn`: a small HTTP/1.1 client over asyncio
    streams, so that the load costs the 2 cores less than the witness it measures; httpx took
    most of a core by itself)."""
    latencies: list[float] = []
    answers: list[list[bytes]] = [[] for _ in chains]

    async def one(i: int, chain: list[bytes]) -> None:
        conn = Conn(port)
        try:
            for body in chain:
                t = time.perf_counter()
                r = await conn.request("POST", "/add-checkpoint", body, ctype="text/plain")
                latencies.append(time.perf_counter() - t)
                if r.status != 200:
                    raise SystemExit(f"add-checkpoint answered {r.status}: {r.body[:200]!r}")
                answers[i].append(r.body)
        finally:
            conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(one(i, c) for i, c in enumerate(chains)))
    return time.perf_counter() - start, latencies, answers


def check_one(log: WitnessedLog, size: int, answer: bytes, vkey: str) -> None:
    key = VerifierKey.parse(vkey)
    blob = base64.b64decode(answer.decode().rsplit(" ", 1)[1])
    (timestamp,) = struct.unpack(">Q", blob[4:12])
    body = log.checkpoint(size).split(b"\n\n")[0] + b"\n"
    Ed25519PublicKey.from_public_bytes(key.public_key).verify(
        blob[12:], b"cosignature/v1\ntime %d\n" % timestamp + body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", type=int, default=64, help="logs sending at once (64)")
    ap.add_argument("--steps", type=int, default=40, help="checkpoints each log sends (40)")
    ap.add_argument("--workers", type=int, default=0, help="primary-key workers (0: CPUs)")
    args = ap.parse_args(argv)
    logs, chains = build(args.logs, args.steps)
    work = Path(tempfile.mkdtemp(prefix="bw"))
    server = start_server(seed_data_dir(work / "data"), workers=args.workers, wait=False,
                          extra_env={"STAMPD_WITNESS_FOR": ",".join(log.vkey for log in logs),
                                     # (every log sends from 127.0.0.1: one client's budget
                                     # would be the benchmark's ceiling)
                                     "STAMPD_WITNESS_REQUESTS_PER_CLIENT_MINUTE": "0",
                                     "STAMPD_LOG_LEVEL": "WARNING"})
    try:
        server.wait_ready(workers=1)
        deadline = time.monotonic() + 60
        while True:  # the witness key's worker is up once a cosignature is made
            try:
                r = httpx.get(server.url + "tlog/witness-vkey", timeout=5)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the witness never answered /tlog/witness-vkey")
            time.sleep(0.2)
        vkey = r.text.strip()
        # warm-up: each log's first checkpoint (not measured)
        asyncio.run(drive(server.port, [c[:1] for c in chains]))
        seconds, latencies, answers = asyncio.run(drive(server.port, [c[1:] for c in chains]))
        for log, answered in zip(logs, answers, strict=True):  # each the last of its log
            check_one(log, sum(range(1, args.steps + 1)), answered[-1], vkey)
    finally:
        server.stop()
        shutil.rmtree(server.runtime_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    n = len(latencies)
    rate = n / seconds
    q = statistics.quantiles(latencies, n=100)
    print(f"witness: {args.logs} logs x {args.steps - 1} checkpoints, {n} cosignatures in "
          f"{seconds:.2f} s: {rate:.0f} cosignatures/s, latency p50 {q[49] * 1000:.1f} ms, "
          f"p99 {q[98] * 1000:.1f} ms (target >= {TARGET:.0f}/s on 2 cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
