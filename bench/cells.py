"""Cells and how they are measured: a Cell is one row of the table (one server, key, stamp mode and
connection count: good responses, latency percentiles, wrong answers, the CPU split; a cell of
several wrk processes at once holds one part per process), and Measuring, mixed into Bench
(bench.run), fills cells within the time budget: distinct commit-id prefixes, wrk with
bench/stamp.lua (warm-up, then the measured run), CPU snapshots around it, and every sampled body
checked (bench.checks).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.checks import Target, verify_sample
from bench.procs import CLK_TCK, T0, BenchError, cpu_busy, kill_pids, progress, sweep
from bench.servers import Server

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LUA = HERE / "stamp.lua"


@dataclass(kw_only=True)
class Measured:
    """What one cell measured, for bench.run's cells and bench.tsa's: good responses, latency
    percentiles, wrong answers and the CPU split."""

    requests: int = 0
    seconds: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    bad: int = 0
    socket_errors: int = 0
    first_bad: str = ""
    samples: int = 0
    sample_failures: list[str] = field(default_factory=list)
    wrk_cpu: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    # CPU seconds of each role's busiest process (its own time, not its reaped children's)
    busiest: dict[str, float] = field(default_factory=dict)
    machine_cpu: float = 0.0  # CPU seconds the whole machine was busy during the cell
    skipped: str = ""

    @property
    def background(self) -> float:
        """Cores used by everything else on the machine during the cell (other jobs, the idle
        peer server): CPU the server under test could not have."""
        if not self.seconds:
            return 0.0
        return max(0.0, self.machine_cpu - sum(self.cpu.values()) - self.wrk_cpu) / self.seconds

    @property
    def wrong(self) -> int:
        return self.bad + self.socket_errors + len(self.sample_failures) + (
            0 if self.requests or self.skipped else 1)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def why_wrong(self) -> str:
        return (f"bad {self.bad}, socket errors {self.socket_errors}, sample failures "
                f"{len(self.sample_failures)}; "
                f"{self.first_bad or (self.sample_failures[:1] or [''])[0]}")

    def as_json(self) -> dict[str, object]:
        return dict(asdict(self), rate=self.rate, wrong=self.wrong)


@dataclass
class Cell(Measured):
    key: str
    mode: str
    conns: int
    server: str
    # Several wrk processes at once (two keys served at once): one cell per process; this
    # cell then holds their sums (requests, wrong answers, CPU) and the longest duration.
    parts: list[Cell] = field(default_factory=list)

    @property
    def rate(self) -> float:
        if self.parts:
            return sum(p.rate for p in self.parts)
        return super().rate

    def as_json(self) -> dict[str, object]:
        return dict(super().as_json(), parts=[p.as_json() for p in self.parts])


SOCKET_ERRORS = ("connect", "read", "write", "timeout")


def count(cell: Measured, res: dict[str, object]) -> None:
    """Add one BENCH-RESULT's wrong answers and socket errors to `cell` (warm-ups count too)."""
    cell.bad += int(res["bad"])  # type: ignore[call-overload]
    errors = sum(int(res[k]) for k in SOCKET_ERRORS)  # type: ignore[call-overload]
    cell.socket_errors += errors
    if not cell.first_bad and res.get("first_bad"):
        cell.first_bad = str(res["first_bad"])
    elif not cell.first_bad and errors:
        cell.first_bad = "socket errors: " + ", ".join(
            f"{k} {res[k]}" for k in SOCKET_ERRORS if res[k])


def record(cell: Measured, res: dict[str, object]) -> None:
    """The measured run's BENCH-RESULT: counted, and its requests, duration and latencies."""
    count(cell, res)
    cell.requests = int(res["requests"])  # type: ignore[call-overload]
    cell.seconds = int(res["duration_us"]) / 1e6  # type: ignore[call-overload]
    cell.p50_ms = int(res["p50_us"]) / 1000  # type: ignore[call-overload]
    cell.p99_ms = int(res["p99_us"]) / 1000  # type: ignore[call-overload]


def stop_servers(servers: list[Server], root: Path) -> None:
    """Stop every server, the last started first, then sweep up what is left under `root`."""
    for s in reversed(servers):
        try:
            s.stop()
        except Exception as e:  # keep stopping the others
            progress(f"{s.name}: stop failed: {e!r}")
    sweep(root, "bench")


def log_trouble(servers: list[Server]) -> dict[str, list[str]]:
    """Each server's log lines that look like trouble (bench.servers Server.problems), the
    first of them said on stderr."""
    problems = {s.name: s.problems() for s in servers}
    for s in servers:
        if problems[s.name]:
            progress(f"{s.name}: {len(problems[s.name])} warning/error lines in {s.log}, "
                     f"first: {problems[s.name][0][:200]}")
    return problems


def print_wrong(cells: list[tuple[str, Measured]], what: str) -> int:
    """A FAIL line and one line per (name, cell) with wrong answers; their count."""
    wrong = sum(c.wrong for _, c in cells)
    if wrong:
        print(f"\nFAIL: {wrong} wrong {what}")
        for name, c in cells:
            if c.wrong:
                print(f"  {name}: {c.why_wrong()}")
    return wrong


def wrk_argv(script: Path, server: Server, conns: int, seconds: int, *args: str,
             threads: int | None = None) -> list[str]:
    """wrk with `script` and its arguments against `server`: `threads` threads, by default one
    up to 16 connections and two above."""
    threads = threads or (1 if conns <= 16 else 2)
    return ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s",
            "--timeout", "10s", "-s", str(script), server.url, "--", *args]


def sample_arg(sample_dir: Path | None) -> str:
    """The SAMPLES argument of stamp.lua and tsa.lua: a directory with a trailing slash, or -."""
    return "-" if sample_dir is None else str(sample_dir) + "/"


def run_wrk(argvs: list[list[str]], seconds: int) -> tuple[list[dict[str, object]], float]:
    """Run these wrk command lines at the same time (each for `seconds`); return each one's
    BENCH-RESULT and the CPU seconds all of them used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs: list[subprocess.Popen[bytes]] = []
    outs: list[tuple[int, str, str]] = []
    try:
        for argv in argvs:
            procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        deadline = time.monotonic() + seconds + 30
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as e:
                raise BenchError(f"wrk took longer than {seconds + 30}s") from e
            outs.append((p.returncode, out.decode(errors="replace"),
                         err.decode(errors="replace")))
    finally:
        for p in procs:
            if p.poll() is None:
                kill_pids([p.pid], "wrk")
                p.wait(timeout=10)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    results = []
    for rc, out, err in outs:
        line = next((ln for ln in out.splitlines() if ln.startswith("BENCH-RESULT ")), None)
        if rc != 0 or line is None:
            raise BenchError(f"wrk failed ({rc}): {out[-500:]}{err[-500:]}")
        results.append(json.loads(line.split(" ", 1)[1]))
    return results, cpu


def measure_wrk(server: Server, cell: Measured, argvs: list[list[str]],
                seconds: int) -> list[dict[str, object]]:
    """run_wrk, with the CPU of the server (by role, and of each role's busiest process), of wrk
    and of the whole machine written to `cell`."""
    procs0, busy0 = server.processes(), cpu_busy()
    results, wrk_cpu = run_wrk(argvs, seconds)
    procs1, busy1 = server.processes(), cpu_busy()
    cell.machine_cpu = busy1 - busy0
    cell.wrk_cpu = wrk_cpu
    cell.cpu, cell.busiest = {}, {}
    for procs, sign in ((procs1, 1), (procs0, -1)):
        # by role, before from after: a child that ended during the cell was reaped by its
        # parent in the tree, whose time (cutime) now holds all of it
        for role, p in procs.values():
            cell.cpu[role] = cell.cpu.get(role, 0.0) + sign * p.ticks / CLK_TCK
    for pid, (role, p) in procs1.items():
        own0 = procs0[pid][1].own if pid in procs0 else 0  # or it started during the cell
        cell.busiest[role] = max(cell.busiest.get(role, 0.0), (p.own - own0) / CLK_TCK)
    return results


class Measuring:
    """Measuring cells within the time budget (--budget, from the bench's start), in the bench
    directory `root`: the base of Bench (bench.run) and Scale (bench.scale)."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.cells: list[Cell] = []
        self.seq = 0
        self.nonce = os.urandom(5).hex()
        self.deadline: float = T0 + args.budget

    # -- bookkeeping

    def cell_time(self) -> float:
        return self.args.warmup + self.args.duration + 3.0

    def have_time(self, cells: int = 1, extra: float = 0.0) -> bool:
        return time.monotonic() + cells * self.cell_time() + extra < self.deadline

    def prefix(self) -> str:
        self.seq += 1
        return f"{self.nonce}{self.seq:012x}"  # 22 hex digits

    def wrk(self, server: Server, mode: str, conns: int, seconds: int,
            prefix: str, sample_dir: Path | None,
            target: Target | None = None) -> tuple[dict[str, object], float]:
        results, cpu = self.wrk_many(server, mode, seconds, [(conns, prefix, sample_dir, target)])
        return results[0], cpu

    def wrk_many(self, server: Server, mode: str, seconds: int,
                 runs: list[tuple[int, str, Path | None, Target | None]]
                 ) -> tuple[list[dict[str, object]], float]:
        """Run one wrk per (connections, prefix, sample directory, target) at the same time;
        return each one's BENCH-RESULT and the CPU seconds all of them used."""
        return run_wrk([self.argv(server, mode, seconds, *r) for r in runs], seconds)

    # wrk pinned to these cores (taskset -c), one thread per 32 connections and per core at
    # most; None: anywhere, as many threads as wrk_argv gives it
    wrk_cpus: list[int] | None = None

    def argv(self, server: Server, mode: str, seconds: int, conns: int, prefix: str,
             sample_dir: Path | None, target: Target | None) -> list[str]:
        cpus = self.wrk_cpus
        threads = max(1, min(len(cpus), conns // 32)) if cpus else None
        argv = wrk_argv(LUA, server, conns, seconds, mode, prefix, sample_arg(sample_dir),
                        threads=threads)
        if target is not None:
            argv += [target.key.armor, target.field]
        if cpus:
            argv = ["taskset", "-c", ",".join(map(str, cpus)), *argv]
        return argv

    def measure(self, server: Server, key: str, mode: str, conns: int, label: str,
                target: Target | None = None) -> Cell:
        cell = Cell(key, mode, conns, label)
        self.cells.append(cell)
        assert server.key is not None
        return self.run_cell(server, cell, [(cell, target or Target(server.key))])

    def measure_together(self, server: Server, key: str, mode: str, label: str,
                         parts: list[tuple[str, int, Target]]) -> Cell:
        """One cell of several wrk processes at once, each asking for its own key (name,
        connections, target); the rows of the table show the total and each part."""
        cell = Cell(key, mode, sum(conns for _, conns, _ in parts), label)
        cell.parts = [Cell(name, mode, conns, label) for name, conns, _ in parts]
        self.cells.append(cell)
        return self.run_cell(server, cell, [(c, t) for c, (_, _, t) in zip(cell.parts, parts,
                                                                            strict=True)])

    def run_cell(self, server: Server, cell: Cell, parts: list[tuple[Cell, Target]]) -> Cell:
        key, mode, conns, label = cell.key, cell.mode, cell.conns, cell.server
        what = f"{label:<12} {key:<14} {mode:<6} c={conns:<3}"
        if not self.have_time():
            cell.skipped = "time budget"
            for p, _ in parts:
                p.skipped = cell.skipped
            progress(f"skip {what}: out of time budget")
            return cell
        progress(f"{what} warm-up + {self.args.duration}s"
                 + (f" ({' + '.join(f'{p.key} c={p.conns}' for p, _ in parts)} at once)"
                    if cell.parts else ""))
        if self.args.warmup > 0:
            warm, _ = self.wrk_many(server, mode, self.args.warmup,
                                    [(p.conns, self.prefix(), None, t) for p, t in parts])
            for (p, _), res in zip(parts, warm, strict=True):
                count(p, res)
        runs: list[tuple[int, str, Path | None, Target | None]] = []
        for p, t in parts:
            name = f"{len(self.cells):03d}-{label}-{key}-{mode}-{conns}"
            if cell.parts:
                name += f"-{p.key}"
            sample_dir = self.root / "samples" / name.replace(" ", "")
            sample_dir.mkdir(parents=True)
            runs.append((p.conns, self.prefix(), sample_dir, t))
        results = measure_wrk(server, cell, [self.argv(server, mode, self.args.duration, *r)
                                             for r in runs], self.args.duration)
        for (p, target), res, (_, prefix, sample_dir, _) in zip(parts, results, runs,
                                                                strict=True):
            record(p, res)
            assert sample_dir is not None
            for path in sorted(sample_dir.glob("*.obj")):
                p.samples += 1
                reason = verify_sample(path, mode, prefix, target.key)
                if reason:
                    p.sample_failures.append(reason)
            if p.samples == 0 and p.requests:
                p.sample_failures.append("no response body was sampled")
            if cell.parts:
                self.report_cell(p, f"  {p.key:<12} c={p.conns:<3}")
        if cell.parts:
            ps = cell.parts
            cell.requests = sum(p.requests for p in ps)
            cell.seconds = max(p.seconds for p in ps)
            cell.bad = sum(p.bad for p in ps)
            cell.socket_errors = sum(p.socket_errors for p in ps)
            cell.samples = sum(p.samples for p in ps)
            cell.sample_failures = [f"{p.key}: {r}" for p in ps for r in p.sample_failures]
            cell.first_bad = next((f"{p.key}: {p.first_bad}" for p in ps if p.first_bad), "")
        self.report_cell(cell, what)
        return cell

    @staticmethod
    def report_cell(cell: Cell, what: str) -> None:
        status = "ok" if not cell.wrong else f"{cell.wrong} WRONG ({cell.first_bad})"
        lat = ("in all (latencies per key above)" if cell.parts else
               f"p50 {cell.p50_ms:7.1f} ms  p99 {cell.p99_ms:7.1f} ms ")
        progress(f"{what} {cell.rate:8.1f}/s {lat} {cell.samples} signatures verified, {status}")
        if not cell.parts:
            for reason in cell.sample_failures:
                progress(f"  sample: {reason}")
