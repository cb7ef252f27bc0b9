"""Scaling table: stampd and zeitgitterd 1.2.0 with more signing processes and more cores, the load
generator pinned apart from the server.

Run from the repository root::

    python -m bench.scale          # or: make bench-scale (make bench runs it after bench.run)

ed25519 tag stamps at fixed concurrencies (--conns, 16 and 64), driven by wrk with bench/stamp.lua
(every answer checked, a sample verified with `gpg --verify`, as in bench.run). The cores this
process may use are split: wrk gets the last --wrk-cores of them, the server under test (with all
its children: API processes, worker supervisor, workers, gpg-agents) the rest, each pinned with
`taskset -c`. For each row one server is started, measured at each concurrency and stopped:

- stampd with 1, 2, 4, ... workers up to the server's cores (one HTTP process);
- stampd with all the server's cores as workers and N API processes (`--api-processes`: 2 and
  cores // 3), when `stampd serve --help` offers the flag; otherwise a note says they were
  skipped;
- zeitgitterd with 1, 4 and the server's cores as gpg-agents (`--number-of-gpg-agents`, one
  parallel signature more than agents);
- unpinned rows: both servers with as many workers / agents as the machine has cores, wrk and
  server anywhere (on 2 cores the pinned rows give the server a single core).

Per row: stamps/s, p50, p99, wrong answers, the CPU per stamp of each process class (wrk
excluded) and the busiest HTTP process's share of one core; then the ratios against zeitgitterd
and a projection to machines with more cores from the measured CPU per stamp. The table goes to
stdout, progress lines to stderr. Exit status: 0 when every answer was right, 1 when one was not,
2 when the bench could not run, 130 when interrupted. See bench/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.cells import Cell, Measuring, log_trouble, print_wrong, stop_servers
from bench.checks import make_home
from bench.procs import (
    BIN,
    add_cell_args,
    ensure_tools,
    idle_load,
    int_list,
    keep_or_remove,
    progress,
    run,
    run_then_stop,
    start_bench,
)
from bench.pyspy import py_spy, recording, summarize_profile
from bench.servers import Server, Stampd, Zeitgitterd

KEY = "ed25519"
MODE = "tag"
CONNS = (16, 64)
ZG_AGENTS = (1, 4)  # and the server's cores
PROJECT_CORES = (2, 4, 8, 12, 16)
START_SECONDS = 5.0  # what starting and stopping one server takes, for the time budget
API_FLAG = "--api-processes"


@dataclass
class Row:
    """One server configuration: its cells, one per concurrency."""

    server: str  # "stampd" or "zeitgitterd"
    signers: int  # stampd workers, zeitgitterd gpg-agents
    api: int | None  # stampd --api-processes; None: not given (zeitgitterd; a tree without it)
    cores: int  # the cores the server may use
    pinned: bool  # server and wrk on cores of their own; else both anywhere
    cells: dict[int, Cell] = field(default_factory=dict)
    skipped: str = ""

    @property
    def label(self) -> str:
        api = f"a{self.api}" if self.api else ""
        where = "p" if self.pinned else "u"
        return f"{self.server[:2]}-{self.signers}{api}{where}"

    @property
    def cores_text(self) -> str:
        return f"{self.cores} {'pinned' if self.pinned else 'unpinned'}"

    @property
    def signers_text(self) -> str:
        what = "worker" if self.server == "stampd" else "agent"
        return f"{self.signers} {what}{'s' if self.signers > 1 else ''}"

    def as_json(self) -> dict[str, object]:
        return {"server": self.server, "signers": self.signers, "api_processes": self.api,
                "cores": self.cores, "pinned": self.pinned, "skipped": self.skipped,
                "cells": {c: cell.as_json() | split(cell) for c, cell in self.cells.items()}}


def split(cell: Cell) -> dict[str, float]:
    """Milliseconds of CPU per good answer by process class (wrk excluded), and the busiest HTTP
    process's share of one core. zeitgitterd's `http` is its Python process with the `gpg`
    processes it spawns per signature (it reaps them: their time ends up in its own)."""
    n = cell.requests
    if not n or not cell.seconds:
        return {}
    ms = {k: 1000 * v / n for k, v in cell.cpu.items()}
    # (stampd serve as the coordinator of several HTTP processes counts among them here)
    http = ms.pop("http", 0.0) + ms.pop("server", 0.0) + ms.pop("gpg", 0.0) \
        + ms.pop("coordinator", 0.0)
    workers = ms.pop("workers", 0.0)
    agents = ms.pop("agents", 0.0)
    busiest = max(cell.busiest.get("http", 0.0), cell.busiest.get("server", 0.0))
    return {"total_ms": http + workers + agents + sum(ms.values()), "http_ms": http,
            "workers_ms": workers, "agents_ms": agents, "other_ms": sum(ms.values()),
            "busiest_http_share": busiest / cell.seconds}


def doubling(upto: int) -> list[int]:
    """1, 2, 4, ... below `upto`, then `upto`."""
    out = [1]
    while out[-1] * 2 < upto:
        out.append(out[-1] * 2)
    return [*out, upto] if upto > 1 else out


def default_api(cores: int, cores_per_api: int) -> int:
    """The API processes `stampd serve` starts by default on `cores` cores."""
    return max(1, cores // cores_per_api)


def has_api_flag() -> bool:
    out = run([str(BIN / "stampd"), "serve", "--help"], timeout=60).stdout.decode()
    return API_FLAG in out


def plan(cores: int, server_cores: int, api: bool, cores_per_api: int,
         api_counts: Sequence[int] | None = None, workers: Sequence[int] | None = None,
         zg_agents: Sequence[int] | None = None, unpinned: bool = True) -> list[Row]:
    """The rows, pinned first (stampd and zeitgitterd rows taken in turn, so that background
    load drifts alike and a short budget cuts both), then the unpinned rows. ``api_counts``:
    the HTTP processes of the rows with all cores as workers (default: 2 and the serve
    default); ``workers``: the one-HTTP-process rows' workers (default 1, 2, 4, ... cores);
    ``zg_agents``: zeitgitterd's agents (default 1, 4 and the cores; empty: no zeitgitterd)."""
    one = 1 if api else None  # one HTTP process; a tree without the flag has exactly one

    def api_rows(n: int, pinned: bool) -> list[Row]:
        counts = set(api_counts) if api_counts is not None else {2, default_api(n, cores_per_api)}
        rows = [Row("stampd", n, a, n, pinned) for a in sorted(counts - {1})]
        for r in rows if not api else []:
            r.skipped = f"this stampd has no {API_FLAG}"
        return rows

    rows: list[Row] = []
    if server_cores:
        st = [Row("stampd", w, one, server_cores, True)
              for w in (workers if workers is not None else doubling(server_cores))]
        st += api_rows(server_cores, True)
        zg = [Row("zeitgitterd", a, None, server_cores, True)
              for a in sorted(set(zg_agents) - {0} if zg_agents is not None
                              else {*ZG_AGENTS, server_cores})]
        rows += [r for pair in itertools.zip_longest(st, zg) for r in pair if r is not None]
    if not unpinned and server_cores:
        return rows
    rows += [Row("stampd", cores, one, cores, False), *api_rows(cores, False)]
    if zg_agents is None or set(zg_agents) - {0}:
        rows.append(Row("zeitgitterd", cores, None, cores, False))
    return rows


class Scale(Measuring):
    """The whole run: the plan's rows one server at a time (Measuring fills their cells), the
    report with the ratios and the projection, every process stopped at the end."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        super().__init__(args, root)
        self.servers: list[Server] = []
        cpus = sorted(os.sched_getaffinity(0))
        self.cores = len(cpus)
        wrk_cores = args.wrk_cores or max(1, self.cores // 4)
        if self.cores - wrk_cores < 1:
            wrk_cores = 0  # no core to spare: unpinned rows only
        self.server_cpus = cpus[:self.cores - wrk_cores] if wrk_cores else []
        self.pinned_wrk_cpus = cpus[self.cores - wrk_cores:] if wrk_cores else []
        self.api = False
        self.rows: list[Row] = []
        self.idle_load = 0.0
        self.projected: list[dict[str, object]] = []
        self.profiled: list[str] = []

    def execute(self) -> None:
        self.idle_load = idle_load()
        self.api = has_api_flag()
        self.rows = plan(self.cores, len(self.server_cpus), self.api, self.args.cores_per_api,
                         self.args.api, self.args.workers, self.args.zg_agents,
                         unpinned=not self.args.pinned_only)
        if not self.api:
            progress(f"this stampd has no {API_FLAG}: the rows with several API processes "
                     "are skipped")
        rows = sum(not r.skipped for r in self.rows)
        cells = rows * len(self.args.conns)
        need = cells * self.cell_time() + rows * START_SECONDS
        progress(f"{self.cores} cores: server on {cpus_text(self.server_cpus) or '-'}, wrk on "
                 f"{cpus_text(self.pinned_wrk_cpus) or '-'} in the pinned rows; {rows} rows, "
                 f"{cells} cells: at most {need:.0f}s (--budget {self.args.budget:.0f}s)")
        for i, row in enumerate(self.rows):
            self.run_row(i, row)

    def run_row(self, i: int, row: Row) -> None:
        if row.skipped:
            return
        if not self.have_time(len(self.args.conns), extra=START_SECONDS):
            row.skipped = "time budget"
            progress(f"skip {row.server} {row.signers_text} {row.cores_text}: out of time budget")
            return
        server = self.start_row(i, row)
        self.wrk_cpus = self.pinned_wrk_cpus if row.pinned else None
        try:
            for conns in self.args.conns:
                row.cells[conns] = self.measure(server, KEY, MODE, conns, row.label)
            if self.args.profile == row.label:
                self.profile_row(server, row)
            escaped = self.unpinned_processes(server) if row.pinned else []
            if escaped:
                row.skipped = f"processes outside cores {server.cpus}: {escaped}"
                progress(f"{server.name}: {row.skipped}")
        finally:
            server.stop()

    def start_row(self, i: int, row: Row) -> Server:
        name = f"{row.server}-{row.label}"
        workdir = make_home(self.root / f"{i:02d}-{row.label}")
        server: Server
        if row.server == "stampd":
            st = Stampd(name, workdir, self.root / "stampd-data", KEY, row.signers)
            if row.api is not None:
                st.serve_args = [API_FLAG, str(row.api)]
            server = st
        else:
            server = Zeitgitterd(name, workdir, KEY, row.signers, row.signers + 1)
        server.cpus = cpus_text(self.server_cpus) if row.pinned else None
        if isinstance(server, Zeitgitterd):
            server.start_keygen()
        api = f", {row.api} API processes" if row.api else ""
        progress(f"== {row.server}: {row.signers_text}{api}, {row.cores_text}"
                 + (f" (cores {server.cpus})" if server.cpus else ""))
        self.servers.append(server)
        server.start()
        server.wait_ready(180)
        server.fetch_key(self.root / f"{i:02d}-{row.label}-key")
        return server

    def profile_row(self, server: Server, row: Row) -> None:
        """py-spy on the row's HTTP processes (its API processes; the serve process itself when
        it has one) while wrk drives one more cell at the largest concurrency; with --idle, so
        that time spent waiting (locks, sockets, the event loop's poll) shows beside the CPU."""
        exe = py_spy()
        if exe is None:
            self.profiled = ["profile: py-spy is not installed (pip install py-spy); skipped"]
            return
        procs = server.processes()
        api = [pid for pid, (role, p) in procs.items()
               if role == "http" and p.comm.startswith("stampd-http-")]
        pids = api or [pid for pid, (role, _) in procs.items() if role == "http"][:1]
        conns, secs = max(self.args.conns), self.args.duration
        progress(f"profiling {row.label} c={conns} for {secs}s: py-spy --idle on HTTP "
                 f"processes {pids}")
        outs = [self.root / f"profile-{row.label}-{pid}.txt" for pid in pids]
        with recording(exe, list(zip(pids, outs, strict=True)), secs, 200, "--idle"):
            res, _ = self.wrk(server, MODE, conns, secs + 1, self.prefix(), None)
        merged = self.root / f"profile-{row.label}.txt"
        merged.write_text("".join(out.read_text(errors="replace") for out in outs
                                  if out.exists()))
        rate = int(res["requests"]) / (int(res["duration_us"]) / 1e6)  # type: ignore[call-overload]
        self.profiled = [f"profile: {row.label} c={conns}, {rate:.0f} stamps/s while sampled; "
                         f"py-spy --idle at 200 Hz on {len(pids)} HTTP process(es), their "
                         "samples together (waiting counts as well as running, so the shares "
                         "say where a request's time goes, not only the CPU's):",
                         *summarize_profile(merged, without_idle=True)]

    @staticmethod
    def unpinned_processes(server: Server) -> list[int]:
        """The server's processes that may run outside its cores (none, since children inherit
        the affinity of the process that started them; checked rather than assumed)."""
        assert server.cpus is not None
        allowed = {int(c) for c in server.cpus.split(",")}
        out = []
        for pid in server.processes():
            try:
                if not os.sched_getaffinity(pid) <= allowed:
                    out.append(pid)
            except OSError:  # gone meanwhile
                pass
        return out

    def stop_all(self) -> None:
        stop_servers(self.servers, self.root)

    # -- the report

    def best(self, server: str, pinned: bool, conns: int) -> tuple[Row, Cell] | None:
        found = [(r, r.cells[conns]) for r in self.rows if r.server == server
                 and r.pinned == pinned and conns in r.cells and r.cells[conns].requests]
        return max(found, key=lambda rc: rc[1].rate, default=None)

    def report(self) -> list[str]:
        a = self.args
        lines = [
            f"scaling: {KEY} {MODE} stamps, stampd vs zeitgitterd 1.2.0; wrk {a.duration}s per "
            f"cell after {a.warmup}s warm-up; {self.cores} cores; load average at end "
            f"{os.getloadavg()[0]:.2f}; other processes kept {self.idle_load:.2f} cores busy "
            "before the start",
            "pinned rows: server and all its children on cores "
            f"{cpus_text(self.server_cpus) or '-'}, wrk on {cpus_text(self.pinned_wrk_cpus) or '-'}"
            " (taskset -c); unpinned rows: both anywhere",
            "CPU ms per stamp by process class, wrk excluded (zeitgitterd's http: its Python "
            "process and the gpg it runs per signature);",
            "busiest http: the busiest HTTP process's share of one core",
        ]
        if not self.api:
            lines.append(f"several API processes: skipped, `stampd serve --help` has no "
                         f"{API_FLAG} in this tree")
        lines += [
            "",
            f"{'server':<11} {'cores':<10} {'signers':<10} {'api':>3} {'c':>3} | "
            f"{'stamps/s':>9} {'p50 ms':>7} {'p99 ms':>8} | wrong | {'total':>6} {'http':>5} "
            f"{'workers':>7} {'agents':>6} {'other':>5} | busiest http | other load",
            "-" * 124,
        ]
        for r in self.rows:
            head = (f"{r.server:<11} {r.cores_text:<10} {r.signers_text:<10} "
                    f"{r.api or '-':>3}")
            if not r.cells:
                lines.append(f"{head} {'':>3} | skipped: {r.skipped}")
                continue
            for conns, c in r.cells.items():
                if c.skipped or not c.requests:
                    lines.append(f"{head} {conns:>3} | skipped: {c.skipped or 'no answers'}"
                                 f"{'' if not c.wrong else f', wrong {c.wrong}'}")
                    continue
                s = split(c)
                lines.append(
                    f"{head} {conns:>3} | {c.rate:9.1f} {c.p50_ms:7.1f} {c.p99_ms:8.1f} | "
                    f"{c.wrong:>5} | {s['total_ms']:6.2f} {s['http_ms']:5.2f} "
                    f"{s['workers_ms']:7.2f} {s['agents_ms']:6.2f} {s['other_ms']:5.2f} | "
                    f"{s['busiest_http_share']:11.0%} | {c.background:.1f}"
                    + (f"  LONG TAIL: p99 > {TAIL_FACTOR} x p50" if long_tail(c) else ""))
            if r.skipped:
                lines.append(f"{'':<11} note: {r.skipped}")
        lines += ["", "stampd / zeitgitterd, same run, same cores and concurrency:",
                  *self.ratios(), "", *self.projection()]
        if self.profiled:
            lines += ["", *self.profiled]
        measured = [c for c in self.cells if c.seconds]
        if measured:
            wrk = max(c.wrk_cpu / c.seconds for c in measured)
            other = [c.background for c in measured]
            lines += ["", f"wrk used at most {wrk:.0%} of one core in any cell; other processes "
                      f"on the machine used {sum(other) / len(other):.2f} cores on average "
                      f"during the cells (max {max(other):.2f})"]
        return lines

    def ratios(self) -> list[str]:
        out = []
        for pinned, conns in itertools.product((True, False), self.args.conns):
            st, zg = self.best("stampd", pinned, conns), self.best("zeitgitterd", pinned, conns)
            if not st or not zg:
                continue
            where = st[0].cores_text
            out.append(f"  {where}, c={conns}: best {st[1].rate:.0f}/s ({st[0].signers_text}"
                       f"{f', {st[0].api} API' if st[0].api else ''}) / best {zg[1].rate:.0f}/s "
                       f"({zg[0].signers_text}) = {st[1].rate / zg[1].rate:.1f}x")
            for s in self.rows:
                z = next((z for z in self.rows if z.server == "zeitgitterd"
                          and z.pinned == pinned and z.signers == s.signers), None)
                if (s.server != "stampd" or s.pinned != pinned or (s.api or 1) != 1 or not z
                        or not good(s, conns) or not good(z, conns)):
                    continue
                out.append(f"    {s.signers_text} / {z.signers_text}: "
                           f"{s.cells[conns].rate:.0f}/s / {z.cells[conns].rate:.0f}/s = "
                           f"{s.cells[conns].rate / z.cells[conns].rate:.1f}x")
        return out or ["  (no pair of stampd and zeitgitterd rows was measured)"]

    def projection(self) -> list[str]:
        """stamps/s on K server cores ~ min(K / total CPU per stamp, N_http / HTTP CPU per
        stamp), from the best pinned stampd row (the unpinned ones share cores with wrk)."""
        found = [b for c in self.args.conns if (b := self.best("stampd", True, c))]
        if not found:
            return ["projection: no pinned stampd row was measured"]
        row, cell = max(found, key=lambda rc: rc[1].rate)
        s = split(cell)
        total, http = s["total_ms"] / 1000, s["http_ms"] / 1000
        k = self.args.cores_per_api
        out = [f"PROJECTION, not a measurement: stamps/s on K server cores ~ min(K / total CPU "
               f"per stamp, N / HTTP CPU per stamp), N = max(1, K // {k}) API processes (the "
               "serve default),",
               f"from the best pinned stampd row ({row.signers_text}, {row.cores_text}, "
               f"c={cell.conns}, {cell.rate:.0f}/s): total {1000 * total:.2f} ms, http "
               f"{1000 * http:.2f} ms per stamp; it assumes",
               "the CPU per stamp stays as measured and nothing else (agents, journal, locks) "
               "limits first.",
               f"  {'K':>3} {'N':>3} | {'stamps/s':>9} | bound by"]
        if total <= 0 or http <= 0:
            return [*out[:3], "  (no CPU time was measured)"]
        self.projected = projected = []
        for cores in self.args.project:
            n = default_api(cores, k)
            by_cores, by_http = cores / total, n / http
            projected.append({"cores": cores, "api_processes": n,
                              "stamps_per_s": min(by_cores, by_http),
                              "bound_by": "cores" if by_cores <= by_http else "http"})
            out.append(f"  {cores:>3} {n:>3} | {min(by_cores, by_http):9.0f} | "
                       f"{projected[-1]['bound_by']}")
        return out

    def as_json(self) -> dict[str, object]:
        return {"cores": self.cores, "server_cpus": self.server_cpus,
                "wrk_cpus": self.pinned_wrk_cpus, "api_processes_flag": self.api,
                "rows": [r.as_json() for r in self.rows],
                "idle_load": self.idle_load, "projection": self.projected}


TAIL_FACTOR = 5  # a cell whose p99 exceeds this many times its p50 is flagged


def long_tail(cell: Cell) -> bool:
    return bool(cell.p50_ms and cell.p99_ms > TAIL_FACTOR * cell.p50_ms)


def good(row: Row, conns: int) -> bool:
    c = row.cells.get(conns)
    return bool(c and c.requests and not c.skipped)


def cpus_text(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


def tools() -> None:
    ensure_tools("taskset", "gpg", "gpg-agent", "gpg-connect-agent", "gpgconf", "git",
                 programs=("stampd", "zeitgitterd"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cell_args(ap, duration=5, budget=180.0)
    ap.add_argument("--conns", type=int_list, default=CONNS,
                    help="concurrencies, comma-separated (default 16,64)")
    ap.add_argument("--wrk-cores", type=int, default=0,
                    help="cores for wrk in the pinned rows (default: a quarter, at least 1)")
    ap.add_argument("--cores-per-api", type=int, default=3,
                    help="the serve command's default API processes, max(1, cores // this), "
                         "for the API rows and the projection (default 3)")
    ap.add_argument("--api", type=int_list, default=None,
                    help="HTTP processes of the rows with all the server's cores as workers, "
                         "comma-separated (default: 2 and the serve default)")
    ap.add_argument("--workers", type=int_list, default=None,
                    help="workers of the pinned one-HTTP-process rows (default 1, 2, 4, ... "
                         "the server's cores)")
    ap.add_argument("--zg-agents", type=int_list, default=None,
                    help="zeitgitterd's agents in the pinned rows (default 1, 4 and the "
                         "server's cores; 0 alone: no zeitgitterd rows)")
    ap.add_argument("--profile", metavar="ROW",
                    help="py-spy on every HTTP process of the row labelled ROW (e.g. st-12a4p: "
                         "stampd, 12 workers, 4 API processes, pinned) during one more cell at "
                         "the largest --conns, waiting included (--idle); the summary follows "
                         "the table")
    ap.add_argument("--pinned-only", action="store_true",
                    help="no unpinned rows (where there are pinned ones)")
    ap.add_argument("--project", type=int_list, default=PROJECT_CORES,
                    help="server cores to project to (default 2,4,8,12,16)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = start_bench("bs")
    bench = Scale(args, root)
    status = run_then_stop([tools, bench.execute], bench.stop_all)
    if bench.rows:
        print("\n".join(bench.report()))
    problems = log_trouble(bench.servers)
    if args.json:
        args.json.write_text(json.dumps(bench.as_json() | {"server_problems": problems},
                                        indent=1))
    if print_wrong([(f"{c.server} c={c.conns}", c) for c in bench.cells],
                   "answers or signatures"):
        status = status or 1
    keep_or_remove(root, bool(status or args.keep))
    return status


if __name__ == "__main__":
    sys.exit(main())
