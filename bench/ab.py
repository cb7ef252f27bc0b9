"""A/B: this tree's stampd against the same server at another commit, side by side in one run.

Run from the repository root::

    python -m bench.ab --ref 44c280a                     # tag stamps, c=16, one HTTP process
    python -m bench.ab --ref 44c280a --tlog off           # the transparency log off
    python -m bench.ab --ref 44c280a --api-processes 4 --conns 64
    python -m bench.ab --ref this --ref-tlog off          # this tree: the log on against off

The commit is checked out (``git worktree add --detach``) under the bench directory and run
with this tree's venv, its packages found first (``PYTHONPATH``); two ``stampd serve`` (each
with its own fresh data directory and key, ``--workers`` signers, the log commit hourly, the
transparency log ``--tlog``) are started once and stay up. Then ``--rounds`` rounds, each one
cell of ed25519 tag stamps at ``--conns`` connections for ``--duration`` seconds on each side
(wrk with bench/stamp.lua, every answer checked, a sample verified with ``gpg --verify``, as
in bench.run), the order of the two sides alternating from round to round so that the
machine's drift hits both. The CPU of each server's whole process tree (HTTP processes,
supervisor, workers, agents; wrk apart) is read from /proc around each cell.

``--ref this`` runs this tree on both sides (no checkout), to compare settings
(``--ref-api-processes`` too): ``--ref-tlog``
gives the ref side's transparency log (by default ``--tlog``'s).

The table: per side, the median over the rounds of stamps per second, p99 and CPU ms per
stamp, and the ratios this/ref; then each side's CPU ms per stamp by kind of process (the HTTP
processes, the coordinator where there are several, the workers, their agents) and the
coordinator's share of one core. Exit status: 0 when every answer was right, 1 when one was not,
2 when the bench could not run, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from bench.cells import Cell, Measuring, log_trouble, print_wrong, stop_servers
from bench.checks import make_home
from bench.procs import (
    BenchError,
    add_cell_args,
    ensure_tools,
    idle_load,
    keep_or_remove,
    progress,
    start_bench,
)
from bench.scale import split
from bench.servers import Stampd

KEY = "ed25519"
MODE = "tag"
# The order the CPU of each kind of process is printed in (`Stampd.role`).
ROLES = ("http", "coordinator", "workers", "agents", "pool", "other")
REPO = Path(__file__).resolve().parent.parent


def checkout(ref: str, where: Path) -> str:
    """``ref`` checked out (detached) at ``where``; its commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True)
    if commit.returncode:
        raise BenchError(f"--ref {ref}: not a commit of this repository")
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(where),
                    commit.stdout.strip()], check=True)
    return commit.stdout.strip()


def remove_checkout(where: Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)],
                   capture_output=True)


def its_code(tree: Path) -> str:
    """Where ``import server`` finds the server with ``PYTHONPATH=tree`` (it must be there)."""
    out = subprocess.run([sys.executable, "-c", "import server; print(server.__file__)"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(tree)},
                         cwd="/")
    return out.stdout.strip()


class AB(Measuring):
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        args.budget = 1e9  # (the rounds are what they are: no cell is skipped)
        super().__init__(args, root)
        self.servers: list[Stampd] = []

    def server(self, label: str, tree: Path | None, tlog: str, processes: int) -> Stampd:
        workdir = make_home(self.root / label)
        s = Stampd(label, workdir, self.root / f"{label}-data", KEY, self.args.workers)
        s.tlog = tlog == "on"
        if processes:
            s.serve_args = ["--api-processes", str(processes)]
        if tree is not None:
            s.env["PYTHONPATH"] = str(tree)
        self.servers.append(s)
        s.start()
        s.wait_ready(180)
        s.fetch_key(self.root / f"{label}-key")
        return s

    def run(self) -> dict[str, list[Cell]]:
        ref_tree: Path | None = None
        try:
            if self.args.ref != "this":
                ref_tree = self.root / "ref-tree"
                commit = checkout(self.args.ref, ref_tree)
                found = its_code(ref_tree)
                if not found.startswith(str(ref_tree)):
                    raise BenchError(f"the ref's server is not the one imported ({found})")
                progress(f"ref {self.args.ref} = {commit[:12]}, run from {ref_tree}")
            ref_processes = self.args.api_processes if self.args.ref_api_processes is None \
                else self.args.ref_api_processes
            sides = {"ref": self.server("ref", ref_tree, self.args.ref_tlog or self.args.tlog,
                                        ref_processes),
                     "this": self.server("this", None, self.args.tlog,
                                         self.args.api_processes)}
            cells: dict[str, list[Cell]] = {"ref": [], "this": []}
            for r in range(self.args.rounds):
                order = ["ref", "this"] if r % 2 == 0 else ["this", "ref"]
                for side in order:
                    cells[side].append(self.measure(sides[side], KEY, MODE, self.args.conns,
                                                    f"{side}-{r}"))
            return cells
        finally:
            stop_servers(list(self.servers), self.root)
            if ref_tree is not None:
                remove_checkout(ref_tree)


def summary(cells: list[Cell]) -> dict[str, float]:
    good = [c for c in cells if c.requests and c.seconds]
    return {"rate": statistics.median(c.rate for c in good),
            "p99": statistics.median(c.p99_ms for c in good),
            "cpu_ms": statistics.median(split(c)["total_ms"] for c in good)}


def per_stamp_ms(cells: list[Cell], role: str) -> float:
    """The median over ``cells`` of the CPU milliseconds per stamp of ``role``'s processes."""
    return statistics.median(1000 * c.cpu.get(role, 0.0) / c.requests for c in cells)


def table(args: argparse.Namespace, cells: dict[str, list[Cell]], load: float) -> str:
    ref, this = summary(cells["ref"]), summary(cells["this"])
    head = (f"ed25519 tag stamps, c={args.conns}, {args.workers} workers, "
            f"{args.api_processes or 'default'} HTTP processes"
            f"{'' if args.ref_api_processes is None else f' (ref: {args.ref_api_processes})'}"
            f", transparency log {args.tlog}"
            f"{f' (ref: {args.ref_tlog})' if args.ref_tlog else ''}; "
            f"{args.rounds} rounds of {args.duration} s, medians; idle load {load:.2f}")
    lines = [head, f"{'':22} {'ref ' + args.ref:>16} {'this tree':>12} {'this/ref':>9}"]
    for name, key, fmt in (("stamps/s", "rate", "{:.0f}"), ("p99 ms", "p99", "{:.1f}"),
                           ("CPU ms per stamp", "cpu_ms", "{:.3f}")):
        lines.append(f"{name:22} {fmt.format(ref[key]):>16} {fmt.format(this[key]):>12} "
                     f"{this[key] / ref[key] if ref[key] else float('nan'):>8.3f}x")
    for side, label in (("ref", "ref"), ("this", "this tree")):
        good = [c for c in cells[side] if c.requests and c.seconds]
        roles = sorted({role for c in good for role in c.cpu},
                       key=lambda r: (ROLES.index(r) if r in ROLES else len(ROLES), r))
        if good:  # (where the CPU goes: which processes the other side saves or spends)
            lines.append(f"CPU ms per stamp by process ({label}): " + ", ".join(
                f"{role} {per_stamp_ms(good, role):.3f}" for role in roles))
        good = [c for c in good if "coordinator" in c.cpu]
        if good:  # (stampd serve is the coordinator of several HTTP processes)
            ms = per_stamp_ms(good, "coordinator")
            share = statistics.median(c.busiest["coordinator"] / c.seconds for c in good)
            lines.append(f"coordinator ({label}): {ms:.3f} CPU ms per stamp, {share:.0%} of one "
                         f"core; 60% of one core at this rate: {600 / ms:,.0f} stamps/s")
    lines.append("rounds (stamps/s, ref | this): "
                 + " ".join(f"{a.rate:.0f}|{b.rate:.0f}"
                            for a, b in zip(cells["ref"], cells["this"], strict=True)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True,
                    help="the commit to compare this tree against ('this': this tree)")
    ap.add_argument("--ref-tlog", choices=("on", "off"),
                    help="the ref side's transparency log (default: --tlog's)")
    ap.add_argument("--conns", type=int, default=16, help="wrk connections (16)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, each a cell per side (4)")
    ap.add_argument("--workers", type=int, default=2, help="signing workers (2)")
    ap.add_argument("--api-processes", type=int, default=1,
                    help="HTTP processes of each server (1; 0: the server's default)")
    ap.add_argument("--ref-api-processes", type=int,
                    help="the ref side's HTTP processes (default: --api-processes')")
    ap.add_argument("--tlog", choices=("on", "off"), default="on",
                    help="the transparency log (on)")
    add_cell_args(ap, duration=10, budget=None)
    args = ap.parse_args(argv)
    try:
        ensure_tools("wrk", "gpg", "git")
        load = idle_load()
        root = start_bench("stampd-ab-")
        bench = AB(args, root)
        cells = bench.run()
    except BenchError as e:
        print(f"bench.ab: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(table(args, cells, load))
    wrong = print_wrong([(c.server, c) for side in cells.values() for c in side], "cells")
    trouble = log_trouble(list(bench.servers))
    keep_or_remove(root, args.keep or bool(wrong) or any(trouble.values()))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
