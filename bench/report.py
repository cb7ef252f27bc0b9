"""The report, mixed into Bench (bench.run): the table printed on stdout (the side-by-side cells,
then the stampd-only SSH and two-keys rows), the scaling block next to the raw gpg-agent rates, the
CPU per stamp at c=16, and the targets (MET / MISS / n/a with the numbers they were judged on; the
misses decide --strict) with the info lines for the SSH and two-keys cells.
"""

from __future__ import annotations

import argparse
import os

from bench.agentrate import AgentRates
from bench.cells import Cell
from bench.plan import (
    PLAN,
    SCALING_CONNS,
    SSH_KEYS,
    SSH_PLAN,
    TWO_KEYS,
    TWO_KEYS_CONNS,
    TWO_KEYS_ROW,
)


class Report:
    """The report: mixed into Bench (bench.run), which sets these attributes."""

    args: argparse.Namespace
    cells: list[Cell]
    agent: dict[str, AgentRates]
    idle_load: float
    missed: int
    profile: list[str]

    def find(self, key: str, mode: str, conns: int, server: str) -> Cell | None:
        return next((c for c in self.cells if (c.key, c.mode, c.conns, c.server)
                     == (key, mode, conns, server) and not c.skipped and c.requests), None)

    def report(self) -> list[str]:
        w = self.args.workers
        lines = [
            f"stampd ({w} workers) vs zeitgitterd 1.2.0 ({self.args.zg_agents} gpg-agents, "
            f"{self.args.zg_parallel} parallel signatures); wrk {self.args.duration}s per cell "
            f"after {self.args.warmup}s warm-up; {os.cpu_count()} CPUs; "
            f"load average at end {os.getloadavg()[0]:.2f}",
            f"other processes kept {self.idle_load:.2f} cores busy before the start; the "
            "'other load' columns say how many cores they took during each cell",
            "",
            f"{'key':<14} {'mode':<6} {'c':>3} | {'zeitgitterd':^26} | {'stampd':^26} | "
            f"{'ratio':>6} | wrong | other load",
            f"{'':<14} {'':<6} {'':>3} | {'stamps/s':>9} {'p50 ms':>7} {'p99 ms':>8} | "
            f"{'stamps/s':>9} {'p50 ms':>7} {'p99 ms':>8} | {'st/zg':>6} | zg/st | zg/st cores",
            "-" * 106,
        ]
        na = f"{'-':>9} {'-':>7} {'-':>8}"  # zeitgitterd has no SSH keys and serves one key

        def fmt(c: Cell | None) -> str:
            if c is None:
                return f"{'skipped':>9} {'':>7} {'':>8}"
            if c.parts:  # several wrk processes at once: percentiles are per part
                return f"{c.rate:9.1f} {'-':>7} {'-':>8}"
            return f"{c.rate:9.1f} {c.p50_ms:7.1f} {c.p99_ms:8.1f}"

        def wrong(c: Cell | None) -> str:
            return "-" if c is None else str(c.wrong)

        def bg(c: Cell | None) -> str:
            return "-" if c is None else f"{c.background:.1f}"

        for key, modes, conns_list in PLAN:
            if key not in self.args.keys:
                continue
            for mode in modes:
                for conns in conns_list:
                    z = self.find(key, mode, conns, "zeitgitterd")
                    s = self.find(key, mode, conns, "stampd")
                    ratio = f"{s.rate / z.rate:6.1f}" if z and s and z.rate else f"{'-':>6}"
                    lines.append(f"{key:<14} {mode:<6} {conns:>3} | {fmt(z)} | {fmt(s)} | "
                                 f"{ratio} | {wrong(z):>2}/{wrong(s):<2} | {bg(z)}/{bg(s)}")
        if "ssh" in self.args.keys:
            w = self.args.workers
            lines.append(f"stampd only: SSH keys and two keys at once (one stampd, ed25519 "
                         f"OpenPGP primary + {' + '.join(SSH_KEYS)}, {w} workers per key)")
            for key, mode, conns_list in SSH_PLAN:
                for conns in conns_list:
                    s = self.find(key, mode, conns, "stampd")
                    lines.append(f"{key:<14} {mode:<6} {conns:>3} | {na} | {fmt(s)} | "
                                 f"{'-':>6} | {'-':>2}/{wrong(s):<2} | -/{bg(s)}")
            both = self.find(TWO_KEYS_ROW, "tag", len(TWO_KEYS) * TWO_KEYS_CONNS, "stampd")
            lines.append(f"{TWO_KEYS_ROW:<14} {'tag':<6} {len(TWO_KEYS) * TWO_KEYS_CONNS:>3} | "
                         f"{na} | {fmt(both)} | {'-':>6} | {'-':>2}/{wrong(both):<2} | "
                         f"-/{bg(both)}")
            for part in (both.parts if both else []):
                share = part.rate / both.rate if both and both.rate else 0.0
                lines.append(f"{'  ' + part.key:<14} {'tag':<6} {part.conns:>3} | {na} | "
                             f"{fmt(part)} | {share:6.0%} | {'-':>2}/{wrong(part):<2} |")
        scaled = [k for k in dict.fromkeys(k for k, _, _ in PLAN) if k in self.args.keys]
        if scaled:
            lines += ["", f"scaling: stampd, tag stamps, c={SCALING_CONNS}, same data directory "
                      "and key, measured back to back",
                      f"{'key':<8} {'workers':>7} | {'stamps/s':>9} {'p50 ms':>7} {'p99 ms':>8} | "
                      f"{'vs 1 worker':>11} | {'1 gpg-agent raw':>15} | {'vs N x agent':>12} | "
                      "other load",
                      "-" * 100]
        for key in scaled:
            one = self.find(key, "tag", SCALING_CONNS, "stampd-w1")
            many = self.find(key, "tag", SCALING_CONNS, f"stampd-w{w}")
            agent = self.agent.get(key)
            for n, c in ((1, one), (w, many)):
                vs1 = f"{c.rate / one.rate:10.2f}x" if c and one and one.rate else f"{'-':>11}"
                ag = f"{agent.one:13.1f}/s" if agent else f"{'-':>15}"
                vsag = (f"{c.rate / (n * agent.one):11.2f}x" if c and agent and agent.one
                        else f"{'-':>12}")
                lines.append(f"{key:<8} {n:>7} | {fmt(c)} | {vs1} | {ag} | {vsag} | {bg(c)}")
            if agent:
                lines.append(f"{key:<8} raw gpg-agent rate: 1 agent {agent.one:.1f}/s, 2 agents "
                             f"at once {agent.two:.1f}/s (the ceiling for 2 workers); other "
                             f"load {agent.background[0]:.1f} / {agent.background[1]:.1f} cores")

        lines += ["", "CPU per stamp at c=16 (ms; from /proc, all processes of each server; "
                  "wrk's own share last)"]
        for c in self.cells:
            if c.conns == 16 and c.requests and not c.skipped and c.cpu:
                parts = ", ".join(f"{k} {1000 * v / c.requests:.2f}"
                                  for k, v in sorted(c.cpu.items()) if v > 0)
                total = 1000 * sum(c.cpu.values()) / c.requests
                lines.append(f"  {c.server:<12} {c.key:<14} {c.mode:<6} total {total:6.2f}: "
                             f"{parts}; wrk {1000 * c.wrk_cpu / c.requests:.2f}")
        measured = [c for c in self.cells if c.seconds and c.cpu]
        wrk_share = max((c.wrk_cpu / c.seconds for c in measured), default=0)
        lines.append(f"  wrk used at most {100 * wrk_share:.0f}% of one core in any cell")
        if measured:
            # Whatever else ran on the machine (other jobs, the idle peer server) steals
            # cores from the server under test: say how much, so noisy runs are visible.
            other = [c.background for c in measured]
            lines.append(f"  other processes on the machine used {sum(other) / len(other):.2f} "
                         f"cores on average during the cells (max {max(other):.2f}) of "
                         f"{os.cpu_count()}")
        lines += ["", "targets:", *self.targets()]
        if self.profile:
            lines += ["", *self.profile]
        return lines

    def targets(self) -> list[str]:
        out = []

        def verdict(ok: bool) -> str:
            return "MET " if ok else "MISS"

        self.missed = 0

        def add(ok: bool | None, text: str) -> None:
            if ok is None:
                out.append(f"  n/a  {text}")
                return
            self.missed += 0 if ok else 1
            out.append(f"  {verdict(ok)} {text}")

        z = self.find("ed25519", "tag", 16, "zeitgitterd")
        s = self.find("ed25519", "tag", 16, "stampd")
        if z and s:
            r = s.rate / z.rate
            add(r >= 10 and s.p99_ms <= 25, f"ed25519 tag c=16: {r:.1f}x zeitgitterd (>= 10x), "
                f"p99 {s.p99_ms:.1f} ms (<= 25 ms)")
        else:
            add(None, "ed25519 tag c=16 not measured")
        for mode in ("tag", "branch"):
            s1 = self.find("ed25519", mode, 1, "stampd")
            if s1:
                add(s1.p50_ms <= 3, f"ed25519 {mode} c=1 (one keep-alive client): "
                    f"p50 {s1.p50_ms:.2f} ms (<= 3 ms)")
        w = self.args.workers
        rsa = self.find("rsa4096", "tag", 16, "stampd")
        agent = self.agent.get("rsa4096")
        one = self.find("rsa4096", "tag", 16, "stampd-w1")
        many = self.find("rsa4096", "tag", 16, f"stampd-w{w}")
        if rsa and agent:
            need = 0.9 * w * agent.one
            add(rsa.rate >= need, f"rsa4096 tag c=16: {rsa.rate:.1f}/s >= 0.9 x {w} workers x "
                f"{agent.one:.1f}/s (one gpg-agent, raw) = {need:.1f}/s")
        if rsa and one:
            need = 0.9 * w * one.rate
            add(rsa.rate >= need, f"rsa4096 tag c=16: {rsa.rate:.1f}/s >= 0.9 x {w} workers x "
                f"{one.rate:.1f}/s (stampd with 1 worker) = {need:.1f}/s")
        if one and many:
            add(many.rate >= 1.8 * one.rate, f"rsa4096 scaling: {w} workers "
                f"{many.rate / one.rate:.2f}x 1 worker (>= 1.8x)")
        out += self.ssh_info()
        e1 = self.find("ed25519", "tag", 16, "stampd-w1")
        en = self.find("ed25519", "tag", 16, f"stampd-w{w}")
        if e1 and en:
            out.append(f"  info ed25519 scaling: {w} workers {en.rate / e1.rate:.2f}x 1 worker "
                       "(the agent is not the bottleneck here)")
        return out

    def ssh_info(self) -> list[str]:
        """SSH keys and two keys at once: no targets (issue 6 sets none), the numbers next to
        the OpenPGP ed25519 stamps of the same run."""
        out = []
        pgp = self.find("ed25519", "tag", 16, "stampd")

        def vs(c: Cell) -> str:
            if not pgp or not pgp.rate:
                return ""
            return f" = {c.rate / pgp.rate:.2f}x OpenPGP ed25519 tag c=16 ({pgp.rate:.1f}/s)"

        for key in dict.fromkeys(k for k, _, _ in SSH_PLAN):
            c = self.find(key, "tag", 16, "stampd")
            if c:
                out.append(f"  info {key} tag c=16: {c.rate:.1f}/s, p99 {c.p99_ms:.1f} ms"
                           f"{vs(c)}")
        c1 = self.find("ssh-ed25519", "tag", 1, "stampd")
        if c1:
            out.append(f"  info ssh-ed25519 tag c=1 (one keep-alive client): p50 "
                       f"{c1.p50_ms:.2f} ms, p99 {c1.p99_ms:.2f} ms")
        both = self.find(TWO_KEYS_ROW, "tag", len(TWO_KEYS) * TWO_KEYS_CONNS, "stampd")
        if both and both.parts:
            split = " + ".join(f"{p.key} {p.rate:.1f}/s (p99 {p.p99_ms:.1f} ms)"
                               for p in both.parts)
            out.append(f"  info two keys at once: {both.rate:.1f}/s = {split}{vs(both)}")
        return out
