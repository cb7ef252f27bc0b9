"""Side-by-side benchmark: stampd against zeitgitterd 1.2.0 on this machine, driven by wrk.

Run from the repository root::

    python -m bench.run            # or: make bench

Everything runs on 127.0.0.1 in a fresh temporary directory (``/tmp/bn*``): each server gets its
own fresh key of the key type under test, zeitgitterd runs with no upstream timestamping
servers, no pushing and no mail. wrk drives both servers with ``bench/stamp.lua`` (distinct
commit ids, every response checked for status and shape, a sample of response bodies written to
disk); the sampled bodies are checked like the real ``git timestamp`` client checks them and
their signatures verified with ``gpg --verify`` against the key the server publishes.

Then, stampd only (zeitgitterd has no SSH and serves one key): one stampd holding an ed25519
OpenPGP key and SSH keys (ed25519, ecdsa-p256), each with its own workers; tag stamps asking for
each SSH key, and both the OpenPGP and the SSH ed25519 key at once (two wrk processes). Sampled
SSH signatures are verified with ``ssh-keygen -Y verify -n git`` against the allowed-signers
line the server publishes for the key asked for.

The table goes to stdout, progress lines to stderr. Exit status: 0 when every response was
right, 1 when any response was wrong (or a sampled signature did not verify), 2 when the bench
itself could not run. Missed performance targets are reported, not turned into a failure
(unless ``--strict``). See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from pathlib import Path

from bench.agentrate import AgentRates, agent_rates
from bench.cells import Measuring, log_trouble, print_wrong, stop_servers
from bench.checks import Target, make_home
from bench.plan import (
    PLAN,
    SCALING_CONNS,
    SSH_KEYS,
    SSH_PLAN,
    TWO_KEYS,
    TWO_KEYS_CONNS,
    TWO_KEYS_ROW,
    ZG_AGENTS,
    ZG_PARALLEL,
)
from bench.procs import (
    BenchError,
    _read,
    add_cell_args,
    ensure_tools,
    idle_load,
    keep_or_remove,
    process_table,
    progress,
    run_then_stop,
    start_bench,
    sweep,
)
from bench.pyspy import py_spy, recording, summarize_profile
from bench.report import Report
from bench.servers import Server, Stampd, Zeitgitterd
from workers.worker import WORKER_NAME


class Bench(Measuring, Report):
    """The whole run: start the servers of each phase, measure the cells of the plan (Measuring,
    bench.cells), stop everything; the report comes from Report (bench.report)."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        super().__init__(args, root)
        self.agent: dict[str, AgentRates] = {}
        self.servers: list[Server] = []
        self.missed = 0
        self.profile: list[str] = []
        self.idle_load = 0.0

    # -- phases

    def start(self, server: Server, timeout: float = 180.0) -> None:
        self.servers.append(server)
        server.start()

    def phase(self, key: str, plan: list[tuple[str, tuple[int, ...]]]) -> None:
        progress(f"== {key}: starting zeitgitterd and stampd with fresh {key} keys")
        base = self.root / key[:2]
        base.mkdir()
        zg = Zeitgitterd(f"zg-{key}", make_home(base / "z"), key, self.args.zg_agents,
                         self.args.zg_parallel)
        data = base / "s" / "d"
        st = Stampd(f"stampd-{key}", make_home(base / "s"), data, key, self.args.workers)
        zg.start_keygen()  # both keys are generated at the same time
        self.start(st)
        self.start(zg)
        st.wait_ready(180)
        zg.wait_ready(60)
        st.fetch_key(base / "vs")
        zg.fetch_key(base / "vz")
        progress(f"stampd: {self.args.workers} workers, key {st.key.fingerprint}; "  # type: ignore[union-attr]
                 f"zeitgitterd: {zg.agents} gpg-agents, {zg.parallel} parallel signatures")

        if self.have_time(extra=2 * self.args.agent_seconds):
            progress(f"one gpg-agent's raw {key} signing rate (Assuan PKSIGN, no HTTP)")
            self.agent[key] = agent_rates(data / "keys" / "secret-key.asc", base / "ag",
                                          self.args.agent_seconds)
            sweep(base / "ag", "agent-rate")
            a = self.agent[key]
            progress(f"gpg-agent {key}: 1 agent {a.one:.1f}/s, 2 agents {a.two:.1f}/s "
                     f"(other load {a.background[0]:.1f} / {a.background[1]:.1f} cores)")

        for mode, conns_list in plan:
            for conns in conns_list:
                # zeitgitterd first, then stampd, cell by cell: background load drifts alike.
                self.measure(zg, key, mode, conns, "zeitgitterd")
                self.measure(st, key, mode, conns, "stampd")
        zg.stop()
        if self.args.profile and key == self.args.keys[0]:
            self.run_profile(st, key)

        # Scaling: the same stampd (same data, same key) with N workers, then with 1 worker.
        if self.args.workers != 1 and self.have_time(2, extra=10):
            self.measure(st, key, "tag", SCALING_CONNS, f"stampd-w{self.args.workers}")
            st.stop()
            one = Stampd(f"stampd-{key}-w1", make_home(base / "s1"), data, key, 1)
            self.start(one)
            one.wait_ready(120)
            one.fetch_key(base / "vs1")
            self.measure(one, key, "tag", SCALING_CONNS, "stampd-w1")
            one.stop()
        st.stop()

    def run_profile(self, st: Stampd, key: str) -> None:
        """py-spy (sampling, non-blocking, GIL holders only) on the HTTP process and on one
        worker while wrk drives tag stamps at c=16; not part of the table."""
        exe = py_spy()
        if exe is None:
            progress("--profile: py-spy is not installed (pip install py-spy); skipped")
            return
        if not self.have_time():
            progress("--profile: out of time budget; skipped")
            return
        assert st.proc is not None
        table = process_table()
        workers = sorted(p.pid for p in table.values() if p.comm == WORKER_NAME
                         and str(st.dir).encode() in _read(f"/proc/{p.pid}/environ"))
        targets = [("http", st.proc.pid)] + ([("worker", workers[0])] if workers else [])
        secs = self.args.duration
        progress(f"profiling stampd {key} tag c={SCALING_CONNS} for {secs}s with py-spy "
                 f"({', '.join(f'{n} pid {p}' for n, p in targets)})")
        outs = [(name, self.root / f"profile-{name}.txt") for name, _ in targets]
        with recording(exe, [(pid, out) for (_, pid), (_, out) in zip(targets, outs, strict=True)],
                       secs, 250, "--gil") as running:
            res, _ = self.wrk(st, "tag", SCALING_CONNS, secs + 1, self.prefix(), None)
        spies = [(name, out, spy) for (name, out), spy in zip(outs, running, strict=True)]
        rate = int(res["requests"]) / (int(res["duration_us"]) / 1e6)  # type: ignore[call-overload]
        self.profile.append(f"profile: stampd {key} tag c={SCALING_CONNS}, {rate:.0f} stamps/s "
                            f"while sampled (py-spy --nonblocking --gil, 250 Hz)")
        for name, out, spy in spies:
            self.profile.append(f"{name} process:")
            if out.exists():
                self.profile += summarize_profile(out)
            else:
                err = spy.stderr.read().decode(errors="replace") if spy.stderr else ""
                self.profile.append(f"  py-spy failed: {err.strip()[-300:]}")

    def execute(self) -> None:
        self.idle_load = idle_load()
        keys = [k for k in dict.fromkeys(k for k, _, _ in PLAN) if k in self.args.keys]
        for key in keys:
            plan = [(m, cs) for k, modes, cs in PLAN if k == key for m in modes]
            self.phase(key, plan)
        if "ssh" in self.args.keys:
            self.ssh_phase()

    def ssh_phase(self) -> None:
        """SSH keys and two keys at once, stampd only: one server holding an ed25519 OpenPGP
        primary key and the SSH keys of SSH_KEYS, --workers workers for each key."""
        w = self.args.workers
        if not self.have_time(extra=10):
            progress("skip ssh: out of time budget")
            return
        progress(f"== ssh: starting stampd with a fresh ed25519 OpenPGP key and "
                 f"{', '.join(SSH_KEYS)}, {w} workers for each key")
        base = self.root / "ssh"
        base.mkdir()
        st = Stampd("stampd-ssh", make_home(base / "s"), base / "s" / "d", "ed25519", w,
                    SSH_KEYS, w)
        self.start(st)
        st.wait_ready(180)
        keys = st.fetch_keys(base / "v")
        progress("stampd: " + ", ".join(f"{kid} {k.fingerprint}" for kid, k in keys.items())
                 + f"; {st.all_workers} workers")

        def target(kid: str) -> Target:
            k = keys.get(kid)
            if k is None:
                raise BenchError(f"stampd-ssh publishes no key {kid} in /v1/keys")
            # Ask for the key by fingerprint (URL-encoded: SSH fingerprints hold + and /).
            return Target(k, "key=" + urllib.parse.quote(k.fingerprint, safe=""))

        for kid, mode, conns_list in SSH_PLAN:
            for conns in conns_list:
                self.measure(st, kid, mode, conns, "stampd", target(kid))
        self.measure_together(st, TWO_KEYS_ROW, "tag", "stampd",
                              [(name, TWO_KEYS_CONNS, target(kid)) for kid, name in TWO_KEYS])
        st.stop()

    def stop_all(self) -> None:
        stop_servers(self.servers, self.root)


# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cell_args(ap, duration=5, budget=280.0)
    ap.add_argument("--workers", type=int, default=2, help="stampd workers (default 2)")
    ap.add_argument("--zg-agents", type=int, default=ZG_AGENTS,
                    help=f"zeitgitterd --number-of-gpg-agents (default {ZG_AGENTS})")
    ap.add_argument("--zg-parallel", type=int, default=ZG_PARALLEL,
                    help=f"zeitgitterd --max-parallel-signatures (default {ZG_PARALLEL})")
    ap.add_argument("--keys", default="ed25519,rsa4096,ssh",
                    help="key types to run, comma-separated (default ed25519,rsa4096,ssh; "
                         "ssh: the stampd-only rows for SSH keys and two keys at once)")
    ap.add_argument("--agent-seconds", type=float, default=2.0,
                    help="seconds for each raw gpg-agent rate measurement (default 2)")
    ap.add_argument("--strict", action="store_true", help="exit 3 when a target is missed")
    ap.add_argument("--profile", action="store_true",
                    help="also profile stampd's HTTP process and one worker with py-spy under "
                         "a c=16 tag load (needs py-spy; adds one cell)")
    args = ap.parse_args(argv)
    args.keys = [k.strip() for k in args.keys.split(",") if k.strip()]
    return args


def tools() -> None:
    ensure_tools("gpg", "gpg-agent", "gpg-connect-agent", "gpgconf", "git", "ssh-keygen",
                 "ssh-agent", programs=("stampd", "zeitgitterd"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = start_bench("bn")
    bench = Bench(args, root)
    status = run_then_stop([tools, bench.execute], bench.stop_all)

    if bench.cells:
        print("\n".join(bench.report()))
    problems = log_trouble(bench.servers)
    if args.json:
        args.json.write_text(json.dumps({
            "cells": [c.as_json() for c in bench.cells],
            "agent_rates": {k: vars(v) for k, v in bench.agent.items()},
            "server_problems": problems}, indent=1))
    if print_wrong([(f"{c.server} {c.key} {c.mode} c={c.conns}", c) for c in bench.cells],
                   "responses or signatures (details above, on stderr)"):
        status = status or 1
    if args.strict and getattr(bench, "missed", 0):
        status = status or 3
    keep_or_remove(root, bool(status or args.keep))
    return status


if __name__ == "__main__":
    sys.exit(main())
