"""`make bench-manifest`: ``POST /v1/manifests`` end to end, and what it costs in memory.

One ``stampd serve`` (the fixed test key, ``--workers 2``, SQLite in a fresh data directory
under /tmp, or ``--database-url``; RFC 3161 off, as `tests.helpers.start_server` runs it).
For each size (10,000 and 1,000,000 lines by default) a body of ``sha256sum -b`` lines
(``<hex> *f<i>``, 73-80 bytes each) is written to a file and POSTed by curl
(``--data-binary @file``), ``--repeat`` times; the time is curl's, from the first byte sent
to the last byte of the signed answer. Each answer must be one OpenPGP signature over
``# lines: <n>``.

Printed per size: digests/s (best and median of the runs), and the peak resident memory
(``VmHWM`` of /proc/PID/status: the high-water mark since start) of the HTTP process and of
each signing worker, read before the first run of the size and after its last; plus the
highest ``VmRSS`` a sampler (every 20 ms) saw while the requests ran. Exit status 1 if an
answer was wrong, 2 if the bench could not run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tests.helpers import Server, seed_data_dir, start_server


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/PID/status (0 once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    m = re.search(rf"^{field}:\s+(\d+) kB$", text, re.M)
    return int(m[1]) if m else 0


class Sampler:
    """The highest VmRSS of each PID seen while it runs (every ``interval`` s)."""

    def __init__(self, pids: dict[str, int], interval: float = 0.02) -> None:
        self.pids = pids
        self.interval = interval
        self.peak = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], status_kib(pid, "VmRSS"))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def write_body(path: Path, n: int) -> int:
    """``n`` sha256sum -b lines into ``path``; its size in bytes."""
    with path.open("wb") as f:
        for start in range(0, n, 100_000):
            f.write("".join(f"{hashlib.sha256(i.to_bytes(8, 'big')).hexdigest()} *f{i}\n"
                            for i in range(start, min(n, start + 100_000))).encode())
    return path.stat().st_size


def post(server: Server, body: Path, answer: Path) -> float:
    """POST ``body`` with curl; curl's total time in seconds (HTTP 200 required)."""
    out = subprocess.run(
        ["curl", "-sS", "-o", str(answer), "-w", "%{http_code} %{time_total}",
         "-H", "Content-Type: text/plain", "--data-binary", f"@{body}",
         f"{server.url}v1/manifests"], capture_output=True, check=True, timeout=600)
    status, took = out.stdout.decode().split()
    if status != "200":
        raise AssertionError(f"HTTP {status}: {answer.read_text()[:500]}")
    return float(took)


def mib(kib: int) -> str:
    return f"{kib / 1024:7.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,1000000", help="lines per manifest, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each size")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--database-url", default=None, help="PostgreSQL (default: SQLite)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if shutil.which("curl") is None:
        print("curl is missing", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bm"))
    server = start_server(seed_data_dir(tmp / "data"), workers=args.workers,
                          database_url=args.database_url)
    failed = False
    try:
        workers = sorted(server.worker_pids())
        pids = {"http": server.proc.pid, **{f"worker{i}": p for i, p in enumerate(workers, 1)}}
        print(f"stampd: {args.workers} workers, "
              f"{'PostgreSQL' if args.database_url else 'SQLite'}, {os.cpu_count()} CPUs; "
              f"PIDs {pids}")
        print(f"{'lines':>9} {'MB':>6} {'best/s':>9} {'median/s':>9} {'best s':>7}  "
              + "  ".join(f"{name + ' HWM MiB':>20}" for name in pids)
              + "  " + "  ".join(f"{name + ' RSS peak':>16}" for name in pids))
        for n in sizes:
            body = tmp / f"body-{n}"
            size = write_body(body, n)
            before = {name: status_kib(pid, "VmHWM") for name, pid in pids.items()}
            times = []
            with Sampler(pids) as sampler:
                for _ in range(args.repeat):
                    answer = tmp / "answer"
                    times.append(post(server, body, answer))
                    text = answer.read_bytes()
                    if (text.count(b"-----BEGIN PGP SIGNATURE-----") != 1
                            or f"\n# lines: {n}\n".encode() not in text):
                        print(f"wrong answer for {n} lines", file=sys.stderr)
                        failed = True
                    answer.unlink()
            after = {name: status_kib(pid, "VmHWM") for name, pid in pids.items()}
            body.unlink()
            print(f"{n:>9} {size / 1e6:>6.1f} {n / min(times):>9.0f} "
                  f"{n / statistics.median(times):>9.0f} {min(times):>7.2f}  "
                  + "  ".join(f"{mib(before[k]):>9} -> {mib(after[k]):>7}" for k in pids)
                  + "  " + "  ".join(f"{mib(sampler.peak[k]):>16}" for k in pids),
                  flush=True)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(server.runtime_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
