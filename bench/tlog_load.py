"""The transparency log under load (`python -m bench.tlog_load`, part of `make bench`).

Two stampd servers of the same configuration (`--workers` workers for a fresh ed25519 OpenPGP
key, as bench.run), one with STAMPD_TLOG=off and one with STAMPD_TLOG=on (its log key has one
more worker and agent), are started side by side; then

3. **Throughput, log on against off**: wrk drives digest stamps (`POST /v1/stamps`, bench/stamp.lua
   mode digest) and Zeitgitter tag stamps at c=16 against each in turn, off then on, mode after
   mode, for `--rounds` rounds (bench.cells: a warm-up second, every answer checked, sampled
   signatures verified); the median rate of each server and mode, and the ratio on/off.
4. **Proof latency at a fixed rate**: against the log-on server alone (the other is stopped), an
   open-loop client sends digest stamps on a fixed schedule (`--rate` a second for
   `--load-seconds`, each on a free keep-alive connection), and for about `--probes` of the
   answered stamps, spread over the run, polls `GET /v1/proofs/<serial>` every 20 ms until it
   answers 200: the time from the stamp's answer to its proof. A few proofs are checked with
   `formats.tlog.proof.verify_proof` against `GET /tlog/vkey`, and their entry is the stamp's.

With ``--witnesses N`` (3 in `make bench`), N more stampd servers (one worker each) are the
log-on server's witnesses (docs/witness.md; the keys are made before they start, so that each
knows the other's verifier key), and a probe waits for a proof whose checkpoint carries the
cosignatures of a majority of them (the server's default quorum): the proof latency with
cosignatures included. The sampled proofs are verified with the witness keys and that quorum.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.cells import Measured, Measuring, log_trouble, print_wrong, stop_servers
from bench.checks import make_home
from bench.procs import (
    BenchError,
    cpu_busy,
    ensure_tools,
    http_get,
    idle_load,
    keep_or_remove,
    progress,
    run_then_stop,
    start_bench,
)
from bench.proof_http import Conn, HttpError, Latencies
from bench.servers import Server, Stampd
from formats.note import Ed25519Verifier, parse_note
from formats.tlog.checkpoint import CosignatureVerifier
from formats.tlog.entry import Entry
from formats.tlog.proof import TlogProof, verify_proof

MODES = ("digest", "tag")
CONNS = 16
POLL = 0.02  # seconds between a probe's GET /v1/proofs/<serial>


@dataclass
class Probe:
    """The open-loop run's figures."""

    sent: int = 0
    answered: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0  # first send to last answer
    stamp: Latencies = field(default_factory=Latencies)  # stamp answers
    proof: Latencies = field(default_factory=Latencies)  # answer -> proof available
    polls: int = 0
    max_lag: float = 0.0  # the most a send was late on its schedule
    connections: int = 0  # keep-alive connections the sender opened
    verified: int = 0
    client_cores: float = 0.0  # CPU of this client (sender and prober) / wall time
    machine_cores: float = 0.0  # CPU of the whole machine / wall time


def cosignatures(proof: bytes) -> int:
    """The signature lines of the proof's checkpoint beyond the log's (not verified here)."""
    return len(parse_note(TlogProof.parse(proof).checkpoint).signatures) - 1


async def open_loop(port: int, rate: float, seconds: float, probes: int, quorum: int = 0
                    ) -> tuple[Probe, list[tuple[str, int, bytes]]]:
    """Digest stamps at `rate`/s for `seconds`, each on a free keep-alive connection (a new one
    when none is free); every n-th answered stamp probed for its proof (one cosigned by at
    least ``quorum`` witnesses). Returns the figures and (digest, serial, proof) of the probed
    stamps."""
    out = Probe()
    total = int(rate * seconds)
    every = max(1, total // probes)
    free: list[Conn] = []
    conns: list[Conn] = []
    proofs: list[tuple[str, int, bytes]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def probe(digest: str, serial: int, answered: float) -> None:
        conn = Conn(port, timeout=30)
        try:
            while True:
                out.polls += 1
                a = await conn.request("GET", f"/v1/proofs/{serial}")
                if a.status == 200 and (not quorum or cosignatures(a.body) >= quorum):
                    out.proof.add(time.perf_counter() - answered)
                    proofs.append((digest, serial, a.body))
                    return
                if a.status not in (200, 404) or time.perf_counter() - answered > 30:
                    out.failed.append(f"proof {serial}: {a.status} {a.body[:120]!r}")
                    return
                await asyncio.sleep(POLL)
        except HttpError as e:
            out.failed.append(f"proof {serial}: {e}")
        finally:
            conn.close()

    async def stamp(i: int) -> None:
        if free:
            conn = free.pop()
        else:
            conn = Conn(port, timeout=30)
            conns.append(conn)
            out.connections = len(conns)
        digest = secrets.token_hex(32)
        t = time.perf_counter()
        try:
            a = await conn.request("POST", "/v1/stamps", f"sha256={digest}".encode())
        except HttpError as e:
            out.failed.append(f"stamp: {e}")
            return
        done = time.perf_counter()
        free.append(conn)
        out.stamp.add(done - t)
        out.seconds = done - t0
        marker = b"\nserial: "
        ours = f"\ndigest: {digest}\n".encode()
        if a.status != 200 or ours not in a.body or marker not in a.body:
            out.failed.append(f"stamp: {a.status} {a.body[:120]!r}")
            return
        out.answered += 1
        if i % every == every // 2:
            serial = int(a.body.split(marker, 1)[1].split(b"\n", 1)[0])
            spawn(probe(digest, serial, done))

    def spawn(coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[call-overload]
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    t0 = time.perf_counter()
    for i in range(total):
        due = t0 + i / rate
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        else:
            out.max_lag = max(out.max_lag, now - due)
        out.sent += 1
        spawn(stamp(i))
    while tasks:
        await asyncio.gather(*list(tasks))
    for c in conns:
        c.close()
    return out, proofs


class LoadBench(Measuring):
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        super().__init__(args, root)
        self.servers: list[Server] = []
        self.load: list[float] = []  # load average (1 min) at the start of each part
        self.probe: Probe | None = None
        self.conns = 0
        self.witnesses: list[tuple[Stampd, str]] = []  # (server, its witness vkey)
        self.quorum = 0

    def server(self, tlog: bool) -> Stampd:
        name = "log-on" if tlog else "log-off"
        base = self.root / name
        st = Stampd(f"stampd-{name}", make_home(base / "s"), base / "s" / "d", "ed25519",
                    self.args.workers)
        st.tlog = tlog
        if tlog and self.args.witnesses:
            self.add_witnesses(st)
        self.servers.append(st)
        st.start()
        return st

    def add_witnesses(self, log: Stampd) -> None:
        """Start ``--witnesses`` stampd witnesses of ``log`` (one worker each) and configure
        ``log`` to send them its checkpoints; the keys are made here first."""
        from formats.keys import TLOG_KEY, WITNESS_KEY, KeySpec, tlog_vkey, witness_vkey
        from keystore.keyset import SshKeyStore, key_dir

        def keygen(keys: Path, spec: KeySpec) -> str:  # (as `stampd serve` makes it)
            store = SshKeyStore(key_dir(keys, spec))
            store.ensure(spec.algo, "bench")
            return store.public_key_file.read_text()

        origin = "bench.invalid/log-on"
        log.env["STAMPD_TLOG_ORIGIN"] = origin
        log_vkey = tlog_vkey(origin, keygen(log.data_dir / "keys", TLOG_KEY))
        configured = []
        for i in range(self.args.witnesses):
            base = self.root / f"witness-{i}"
            w = Stampd(f"stampd-witness-{i}", make_home(base / "s"), base / "s" / "d",
                       "ed25519", 1)
            w.tlog, w.witness = False, True
            name = f"bench.invalid/witness-{i}"
            vkey = witness_vkey(name, keygen(w.data_dir / "keys", WITNESS_KEY))
            w.env.update(STAMPD_WITNESS_FOR=log_vkey, STAMPD_WITNESS_NAME=name)
            self.servers.append(w)
            w.start()
            self.witnesses.append((w, vkey))
            configured.append(f"http://127.0.0.1:{w.port}={vkey}")
        log.env["STAMPD_WITNESSES"] = ",".join(configured)
        self.quorum = self.args.witnesses // 2 + 1  # (the server's default quorum)
        for w, _ in self.witnesses:
            w.wait_ready(180)

    def execute(self) -> None:
        idle_load()
        progress(f"starting two stampd with {self.args.workers} workers and a fresh ed25519 "
                 "key: STAMPD_TLOG=off and STAMPD_TLOG=on")
        off, on = self.server(False), self.server(True)
        for st in (off, on):
            st.wait_ready(180)
            st.fetch_key(self.root / f"v-{st.name}")
        self.load.append(os.getloadavg()[0])
        for _ in range(self.args.rounds):
            for mode in MODES:
                for st in (off, on):
                    self.measure(st, "ed25519", mode, CONNS, st.name)
        off.stop()
        self.load.append(os.getloadavg()[0])
        self.proof_latency(on)
        on.stop()

    def proof_latency(self, st: Stampd) -> None:
        a = self.args
        progress(f"open loop: digest stamps at {a.rate:.0f}/s for {a.load_seconds:.0f} s, "
                 f"about {a.probes} probed for their proofs every {POLL * 1000:.0f} ms")
        t, busy, me = time.monotonic(), cpu_busy(), resource.getrusage(resource.RUSAGE_SELF)
        try:  # (uvloop, which uvicorn brings, where installed: the client then costs less CPU)
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        try:
            self.probe, proofs = loop.run_until_complete(
                open_loop(st.port, a.rate, a.load_seconds, a.probes, self.quorum))
        finally:
            loop.close()
        wall, end = time.monotonic() - t, resource.getrusage(resource.RUSAGE_SELF)
        self.probe.client_cores = (end.ru_utime + end.ru_stime - me.ru_utime - me.ru_stime) / wall
        self.probe.machine_cores = (cpu_busy() - busy) / wall
        status, vkey = http_get(st.port, "/tlog/vkey")
        if status != 200:
            raise BenchError(f"GET /tlog/vkey answered {status}")
        verifier = Ed25519Verifier.from_vkey(vkey.decode().strip())
        witnesses = [CosignatureVerifier.from_vkey(v) for _, v in self.witnesses]
        for digest, serial, body in proofs[:: max(1, len(proofs) // 5)]:
            extra = TlogProof.parse(body).extra or b""
            entry = Entry.parse(extra)
            try:
                verify_proof(body, extra, origin=verifier.name, log_keys=[verifier],
                             witnesses=witnesses, quorum=self.quorum)
            except Exception as e:
                self.probe.failed.append(f"proof {serial} does not verify: {e}")
                continue
            if entry.serial != serial or entry.kind != "digest" or entry.digest != digest:
                self.probe.failed.append(f"proof {serial}: the entry is not the stamp's: "
                                         f"{entry}")
                continue
            self.probe.verified += 1

    def stop_all(self) -> None:
        stop_servers(self.servers, self.root)

    def report(self) -> list[str]:
        lines = [f"transparency log under load, stampd {self.args.workers} workers, ed25519, "
                 f"on {os.cpu_count()} cores (load average at the start of each part: "
                 + " / ".join(f"{x:.2f}" for x in self.load) + ")"]
        if self.cells:
            lines.append(f"3. throughput, c={CONNS}, {self.args.duration} s cells, median of "
                         f"{self.args.rounds} rounds (off and on alternated)")
            lines.append(f"  {'mode':<7} {'log off /s':>10} {'log on /s':>10} {'on/off':>7}"
                         "   each round (off/on)")
            for mode in MODES:
                rates = {s: [c.rate for c in self.cells if c.mode == mode and c.server == s
                             and not c.skipped] for s in ("stampd-log-off", "stampd-log-on")}
                off, on = rates["stampd-log-off"], rates["stampd-log-on"]
                if not off or not on:
                    continue
                m_off, m_on = statistics.median(off), statistics.median(on)
                rounds = ", ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(off, on, strict=False))
                lines.append(f"  {mode:<7} {m_off:>10.1f} {m_on:>10.1f} {m_on / m_off:>7.3f}"
                             f"   {rounds}   (target on/off >= 0.95)")
        p = self.probe
        if p is not None:
            lines.append(f"4. proof latency, open loop at {self.args.rate:.0f} digest stamps/s "
                         f"for {self.args.load_seconds:.0f} s against the log-on server")
            lines.append(f"  stamps: {p.sent} sent, {p.answered} answered in {p.seconds:.1f} s"
                         f" = {p.answered / p.seconds if p.seconds else 0:.0f}/s; answer "
                         f"{p.stamp.summary()}; sends at most {p.max_lag * 1000:.0f} ms late, "
                         f"{p.connections} connections")
            cosigned = (f", cosigned by {self.quorum} of {len(self.witnesses)} witnesses"
                        if self.witnesses else "")
            lines.append(f"  answer -> proof{cosigned}: {p.proof.summary()}  (target p99 <= "
                         "1500 ms); "
                         f"{p.polls} polls; {p.verified} proofs verified")
            if self.witnesses:
                lines.append(f"  witnesses: {len(self.witnesses)} stampd witnesses of the "
                             "log-on server (one worker each) on the same cores")
            lines.append(f"  CPU: this client {p.client_cores:.2f} cores, the whole machine "
                         f"{p.machine_cores:.2f} of {os.cpu_count()}")
        return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.tlog_load",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="stampd workers (default 2)")
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk cell (10)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up seconds per cell (1)")
    ap.add_argument("--rounds", type=int, default=2, help="off/on rounds (2)")
    ap.add_argument("--rate", type=float, default=1000.0, help="open-loop stamps/s (1000)")
    ap.add_argument("--load-seconds", type=float, default=20.0, help="open-loop seconds (20)")
    ap.add_argument("--probes", type=int, default=300, help="stamps probed for proofs (300)")
    ap.add_argument("--witnesses", type=int, default=0,
                    help="stampd witnesses of the log-on server; proofs then wait for a "
                    "majority of their cosignatures (default 0; make bench: 3)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    args.budget = 600.0  # (Measuring's time budget: not the limit here)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = start_bench("bl")
    bench = LoadBench(args, root)
    status = run_then_stop([lambda: ensure_tools("gpg"), bench.execute], bench.stop_all)
    print("\n".join(bench.report()))
    log_trouble(bench.servers)
    cells: list[tuple[str, Measured]] = [(f"{c.server} {c.mode}", c) for c in bench.cells]
    if print_wrong(cells, "responses or signatures (details above, on stderr)"):
        status = status or 1
    if bench.probe is not None and bench.probe.failed:
        print(f"\nFAIL: {len(bench.probe.failed)} failed stamps or proofs in the open loop, "
              f"first: {bench.probe.failed[0]}")
        status = status or 1
    keep_or_remove(root, bool(status or args.keep))
    return status


if __name__ == "__main__":
    sys.exit(main())
