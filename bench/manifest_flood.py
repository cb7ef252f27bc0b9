"""The whole server under maximal manifests: ``python -m bench.manifest_flood`` (issue 25).

One ``stampd serve`` (the fixed test key; ``--workers`` 2 and ``--api-processes`` 1 unless told;
SQLite in a fresh data directory under /tmp, as `tests.helpers.start_server` runs it; the hourly
manifest byte budgets off, so that only memory and the in-flight budget are measured; ``--env
NAME=VALUE`` adds settings).
Two modes (``--mode``, default both, each on a fresh server):

- ``flood``: ``--manifests`` (8) concurrent POSTs of a manifest of ``--mib`` (127) MiB in
  ``--lines`` (1,000,000) ``sha256sum -b`` lines (the same body for all, from a file). A 503
  is counted, and the POST tried again after its ``Retry-After`` (at most ``--tries`` times in
  all); every 200 must be one OpenPGP signature over ``# lines: <n>``.
- ``readers``: one such manifest is POSTed, then ``--readers`` (24) clients GET it, each with
  a 4 KiB receive buffer, read the status line and stall for ``--hold`` (10) seconds.

Throughout each mode: the resident memory of the whole server (the ``stampd serve`` process
and all its descendants: HTTP processes, workers, and the agents, found by their runtime
directory) summed from /proc/PID/statm every 50 ms; a normal digest stamp (``POST /v1/stamps``,
``sha256=<hex>``) every ~50 ms, one at a time (its latency, p50/p99/max); and ``GET /healthz``
every ~50 ms: its latency is the loop-lag probe (measured from outside: a stall of the HTTP
process's event loop delays that answer by as long; it includes the round trip, ~1 ms idle).
Each probe runs in a process of its own (`Prober`), so that the bench's own work never delays
it. The loop lag is also read from the server itself (``stampd_event_loop_lag_seconds`` on
``GET /metrics``, `server.runtime.looplag`: a timer due every 10 ms in the HTTP process), before and
after: how many of its turns came more than 50 ms late, and the longest since it started. The
target is on that figure: an outside probe also waits for a core of its own on a host whose
cores the load keeps busy. Idle RSS: the median of 2 s before; after: the median of 2 s once
every manifest is answered and 3 s have passed (``--settle``), the stamps going on (as on a
server in use). Printed: one table per mode
with the targets beside the figures (exit status 1 if an answer was wrong, 2 if the bench
could not run; a missed target is shown, not an exit status).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import multiprocessing
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.procs import descendants
from tests.helpers import Server, seed_data_dir, start_server

MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


class TreeRss:
    """The summed RSS of the server's process tree (and its agents) every ``interval`` s;
    the tree is looked up again every second (workers may be restarted)."""

    def __init__(self, server: Server, interval: float = 0.05) -> None:
        self.server = server
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def pids(self) -> list[int]:
        return sorted(set(descendants(self.server.proc.pid)) | set(self.server.agent_pids()))

    def _run(self) -> None:
        pids, found = self.pids(), time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now - found > 1.0:
                pids, found = self.pids(), now
            self.samples.append((now, sum(rss_bytes(p) for p in pids)))
            self._stop.wait(self.interval)

    def each(self) -> str:
        """Each process's RSS now, by what it runs (for the table's footnote)."""
        parts = []
        for pid in self.pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            # (forked processes, named: the HTTP manager and processes, the workers)
            role = comm if comm.startswith("stampd-") else next(
                (a.decode() for a in argv if a.startswith((b"workers.", b"stampd"))),
                os.path.basename(argv[0].decode()))
            parts.append(f"{role} {rss_bytes(pid) / MIB:.0f}")
        return ", ".join(parts)

    def between(self, t0: float, t1: float) -> list[int]:
        return [r for t, r in self.samples if t0 <= t <= t1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Prober:
    """A request every ``interval`` s, one at a time, in a process of its own: its latencies
    (s). (Not a thread of the bench: the bench's threads check each signed manifest's 127 MiB
    holding its GIL, ~100 ms at a time, and a probe thread waiting for the GIL meanwhile
    counted that wait as the server's latency.)"""

    do: Callable[[http.client.HTTPConnection], None]
    port: int
    interval: float = 0.05
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: Any = None
    _results: Any = None
    _process: Any = None

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._results, theirs = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_probe, daemon=True,
                                    args=(self.do, self.port, self.interval, self._stop, theirs))
        self._process.start()
        theirs.close()

    def stop(self) -> None:
        if self._process is None:
            return
        self._stop.set()
        try:
            self.latencies, self.errors = self._results.recv()
        except EOFError:
            self.errors.append("the probe process ended without its figures")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._process = None


def _probe(do: Callable[[http.client.HTTPConnection], None], port: int, interval: float,
           stop: Any, results: Any) -> None:
    """A `Prober`'s process: ``do`` every ``interval`` s until ``stop`` is set, then its
    latencies and errors to ``results``."""
    latencies: list[float] = []
    errors: list[str] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not stop.is_set():
        t = time.perf_counter()
        try:
            do(conn)
            latencies.append(time.perf_counter() - t)
        except (OSError, http.client.HTTPException, AssertionError) as e:
            errors.append(repr(e)[:200])
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        stop.wait(max(0.0, interval - (time.perf_counter() - t)))
    conn.close()
    results.send((latencies, errors))


def stamp_digest(conn: http.client.HTTPConnection) -> None:
    digest = hashlib.sha256(os.urandom(16)).hexdigest()
    conn.request("POST", "/v1/stamps", f"sha256={digest}",
                 {"Content-Type": "application/x-www-form-urlencoded"})
    r = conn.getresponse()
    text = r.read()
    if r.status != 200:
        raise AssertionError(f"stamp: HTTP {r.status} {text[:200]!r}")


def healthz(conn: http.client.HTTPConnection) -> None:
    conn.request("GET", "/healthz")
    r = conn.getresponse()
    r.read()


def write_body(path: Path, lines: int, size: int) -> int:
    """``lines`` sha256sum -b lines of about ``size`` bytes in all into ``path``."""
    pad = max(1, size // lines - 64 - 2 - 1)
    with path.open("wb") as f:
        for start in range(0, lines, 50_000):
            f.write("".join(
                f"{hashlib.sha256(i.to_bytes(8, 'big')).hexdigest()} *{i:0{pad}d}\n"
                for i in range(start, min(lines, start + 50_000))).encode())
    return path.stat().st_size


RESET = -1  # a POST whose connection was reset before its answer was read


def post_manifest(port: int, body: Path, lines: int, tries: int,
                  statuses: list[int], wrong: list[str]) -> None:
    """POST ``body`` (again after a 503's Retry-After, ``tries`` times at most)."""
    for _ in range(tries):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600, blocksize=1 << 20)
        try:
            with body.open("rb") as f:
                # (answered 503 before its body was read: the answer may be there)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    conn.request("POST", "/v1/manifests", f,
                                 {"Content-Type": "text/plain",
                                  "Content-Length": str(body.stat().st_size)})
                r = conn.getresponse()
                text = r.read()
        except (BrokenPipeError, ConnectionResetError):
            statuses.append(RESET)  # refused, and the answer lost to the reset: again
            time.sleep(10)
            continue
        except (OSError, http.client.HTTPException) as e:
            wrong.append(f"POST failed: {e!r}")
            return
        finally:
            conn.close()
        statuses.append(r.status)
        if r.status == 503:
            time.sleep(float(r.getheader("Retry-After") or "10"))
            continue
        if r.status != 200:
            wrong.append(f"HTTP {r.status}: {text[:300]!r}")
        elif (text.count(b"-----BEGIN PGP SIGNATURE-----") != 1
              or f"\n# lines: {lines}\n".encode() not in text):
            wrong.append("a wrong answer")
        return


def dropped_workers(server: Server) -> int:
    """Workers the dispatcher dropped for not answering in time (its log says so)."""
    try:
        return server.log_path.read_text(errors="replace").count("did not answer in time")
    except OSError:
        return -1


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def mib(n: float) -> str:
    return f"{n / MIB:.0f} MiB"


def table(title: str, rows: list[tuple[str, str, str, bool | None]]) -> None:
    print(f"\n{title}")
    print(f"  {'measure':<44} {'figure':>16}  {'target':<16} ")
    for name, figure, target, ok in rows:
        mark = "" if ok is None else ("ok" if ok else "MISSED")
        print(f"  {name:<44} {figure:>16}  {target:<16} {mark}")
    sys.stdout.flush()


def start(tmp: Path, args: argparse.Namespace, name: str) -> Server:
    env = {"STAMPD_MANIFEST_BYTES_PER_CLIENT_HOUR": "0", "STAMPD_MANIFEST_BYTES_PER_HOUR": "0"}
    for item in args.env:
        k, _, v = item.partition("=")
        env[k] = v
    return start_server(seed_data_dir(tmp / name), workers=args.workers, extra_env=env,
                        api_processes=args.api_processes)


def probes(server: Server) -> tuple[Prober, Prober]:
    return Prober(stamp_digest, server.port), Prober(healthz, server.port)


def loop_lag(port: int) -> tuple[dict[float, float], float]:
    """The server's own event-loop lag figures (`server.runtime.looplag`, from ``GET /metrics``):
    the histogram's cumulative counts by upper bound, and the longest lag since it started."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    buckets: dict[float, float] = {}
    longest = float("nan")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "stampd_event_loop_lag_seconds_bucket":
                buckets[float(sample.labels["le"])] = sample.value
            elif sample.name == "stampd_event_loop_lag_max_seconds":
                longest = sample.value
    return buckets, longest


def latency_rows(stamps: Prober, health: Prober, lag_before: tuple[dict[float, float], float],
                 lag_after: tuple[dict[float, float], float],
                 ) -> list[tuple[str, str, str, bool | None]]:
    s, h = stamps.latencies, health.latencies
    (before, _), (after, longest) = lag_before, lag_after
    turns = {le: n - before.get(le, 0) for le, n in after.items()}  # (cumulative, by bound)
    total = turns.get(float("inf"), 0)
    over = total - turns.get(0.05, total)
    p99 = min((le for le, n in turns.items() if n >= 0.99 * total), default=float("nan"))
    return [
        ("digest stamps (answered, errors)", f"{len(s)}, {len(stamps.errors)}", "0 errors",
         not stamps.errors),
        ("digest stamp p50", f"{1000 * pct(s, 0.5):.1f} ms", "", None),
        ("digest stamp p99", f"{1000 * pct(s, 0.99):.1f} ms", "<= 100 ms",
         pct(s, 0.99) <= 0.1),
        ("digest stamp max", f"{1000 * max(s, default=0):.1f} ms", "", None),
        ("loop lag (inside): timer turns, > 50 ms", f"{total:.0f}, {over:.0f}", "0 > 50 ms",
         over == 0),
        ("loop lag (inside): p99 (bucket bound)", f"<= {1000 * p99:g} ms", "", None),
        ("loop lag (inside): max since start", f"{1000 * longest:.1f} ms", "<= 50 ms",
         longest <= 0.05),
        ("/healthz latency p99 (outside)", f"{1000 * pct(h, 0.99):.1f} ms", "", None),
        ("/healthz latency max (outside)", f"{1000 * max(h, default=0):.1f} ms", "", None),
    ]


def baseline(rss: TreeRss, stamps: Prober, health: Prober) -> tuple[float, float]:
    """Start the samplers and probes; after 2 s, (that moment, the median RSS of those 2 s)."""
    rss.start()
    stamps.start()
    health.start()
    time.sleep(2.0)
    now = time.monotonic()
    return now, statistics.median(rss.between(now - 2.0, now))


def flood(tmp: Path, body: Path, args: argparse.Namespace) -> bool:
    server = start(tmp, args, "flood")
    rss = TreeRss(server)
    stamps, health = probes(server)
    statuses: list[int] = []
    wrong: list[str] = []
    try:
        t_idle, idle = baseline(rss, stamps, health)
        idle_each = rss.each()
        lag_before = loop_lag(server.port)
        senders = [threading.Thread(target=post_manifest,
                                    args=(server.port, body, args.lines, args.tries, statuses,
                                          wrong)) for _ in range(args.manifests)]
        t0 = time.perf_counter()
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        took = time.perf_counter() - t0
        t_done = time.monotonic()
        time.sleep(args.settle)  # (the stamps go on meanwhile, as on a server in use)
        t_after = time.monotonic()
        time.sleep(2.0)
        after_each = rss.each()
        lag_after = loop_lag(server.port)
        stamps.stop()
        health.stop()
        rss.stop()
        peak = max(rss.between(t_idle, t_done), default=0)
        after = statistics.median(rss.between(t_after, t_after + 2.0))
        signed = statuses.count(200)
        dropped = dropped_workers(server)
        other = len(statuses) - signed - statuses.count(503) - statuses.count(RESET)
        table(f"flood: {args.manifests} concurrent manifests of {body.stat().st_size / MIB:.1f} "
              f"MiB ({args.lines} lines), {args.workers} workers, {args.api_processes} HTTP "
              f"process(es); {took:.1f} s; server PIDs "
              f"{rss.pids()}", [
                  ("manifests signed", f"{signed} of {args.manifests}",
                   f"{args.manifests}", signed == args.manifests),
                  ("503 answers (then tried again)", f"{statuses.count(503)}", "", None),
                  ("resets before the answer (tried again)", f"{statuses.count(RESET)}", "",
                   None),
                  ("other answers / wrong", f"{other} / {len(wrong)}", "0 / 0", not wrong),
                  ("workers dropped for a timeout", f"{dropped}", "0", dropped == 0),
                  ("whole-server RSS idle", mib(idle), "", None),
                  ("whole-server RSS peak", mib(peak), "<= 1536 MiB", peak <= 1536 * MIB),
                  ("whole-server RSS after", f"{mib(after)} ({after / idle:.2f}x)",
                   "<= 1.2x idle", after <= 1.2 * idle),
                  *latency_rows(stamps, health, lag_before, lag_after)])
        print(f"  RSS MiB idle:  {idle_each}\n  RSS MiB after: {after_each}")
        for w in wrong[:5]:
            print(f"  wrong: {w}")
        for e in (stamps.errors + health.errors)[:5]:
            print(f"  probe error: {e}")
        return not wrong
    finally:
        stamps.stop()
        health.stop()
        server.stop()
        shutil.rmtree(server.runtime_dir, ignore_errors=True)


def readers(tmp: Path, body: Path, args: argparse.Namespace) -> bool:
    server = start(tmp, args, "readers")
    rss = TreeRss(server)
    stamps, health = probes(server)
    socks: list[socket.socket] = []
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600,
                                          blocksize=1 << 20)
        with body.open("rb") as f:
            conn.request("POST", "/v1/manifests", f, {"Content-Type": "text/plain"})
            r = conn.getresponse()
            signed = r.read()
        conn.close()
        if r.status != 200:
            print(f"readers: POST answered {r.status}: {signed[:300]!r}", file=sys.stderr)
            return False
        serial = int(signed.split(b"\n# serial: ", 1)[1].split(b"\n", 1)[0])
        del signed
        t_before, before = baseline(rss, stamps, health)
        lag_before = loop_lag(server.port)
        for _ in range(args.readers):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(60)
            s.connect(("127.0.0.1", server.port))
            s.sendall(f"GET /v1/manifests/{serial} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            socks.append(s)
        ok = all(s.recv(4096).startswith(b"HTTP/1.1 200 ") for s in socks)
        time.sleep(args.hold)
        t_end = time.monotonic()
        lag_after = loop_lag(server.port)
        stamps.stop()
        health.stop()
        rss.stop()
        peak = max(rss.between(t_before, t_end), default=0)
        table(f"readers: {args.readers} stalled readers of a {body.stat().st_size / MIB:.1f} MiB "
              f"manifest for {args.hold:.0f} s", [
                  ("readers answered 200", "yes" if ok else "no", "yes", ok),
                  ("whole-server RSS before", mib(before), "", None),
                  ("whole-server RSS peak", mib(peak), "", None),
                  ("growth", mib(peak - before), "<= 300 MiB", peak - before <= 300 * MIB),
                  *latency_rows(stamps, health, lag_before, lag_after)])
        return ok
    finally:
        for s in socks:
            s.close()
        stamps.stop()
        health.stop()
        server.stop()
        shutil.rmtree(server.runtime_dir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("flood", "readers", "both"), default="both")
    ap.add_argument("--manifests", type=int, default=8)
    ap.add_argument("--mib", type=float, default=127)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--readers", type=int, default=24)
    ap.add_argument("--hold", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--api-processes", type=int, default=1,
                    help="HTTP processes (stampd's own default: one per three CPUs)")
    ap.add_argument("--tries", type=int, default=20, help="POSTs of one manifest at most")
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bmf"))
    try:
        body = tmp / "body"
        write_body(body, args.lines, int(args.mib * MIB))
        ok = True
        if args.mode in ("flood", "both"):
            ok = flood(tmp, body, args) and ok
        if args.mode in ("readers", "both"):
            ok = readers(tmp, body, args) and ok
        return 0 if ok else 1
    except (OSError, RuntimeError) as e:
        print(f"manifest_flood: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
