"""`make crash`: kill -9 under load, then check that the log kept every promise.

For each database (``--db sqlite|postgres|both``) one ``stampd serve`` (the fixed test key,
``--workers 2``, a log commit every 2 s) is loaded by ``--concurrency`` keep-alive clients, each
sending Zeitgitter tag stamps (``POST /``) and digest stamps (``POST /v1/stamps``) in turn, every
one with a commit id or digest no other request uses. Three faults, one after another, each
during at least ``--requests`` requests:

- ``api``: SIGKILL the ``stampd serve`` process, the host's coordinator (its HTTP processes,
  worker supervisor, workers and agents die with it); this program starts it again on the same
  port, data directory and database;
- ``http``: with several HTTP processes (``--api-processes``, 2 by default), SIGKILL one of
  them while the others go on writing the journal; ``stampd serve`` starts another;
- ``worker``: SIGKILL one worker process; the supervisor starts another;
- ``agent``: SIGKILL one worker's gpg-agent (a direct child of the worker); the worker exits and
  the supervisor starts another;
- ``tlog-worker``, ``tlog-agent``: the same for the transparency log key's worker (key id
  ``tlog-ed25519``) and its ssh-agent (``--tlog on``, the default).

Each kill comes at a random moment (``--seed``): after between a fifth and three fifths of the
phase's requests; the HTTP process killed is the log writer (the holder of ``run/log.lock``,
which sequences the transparency log) where one holds it.

Afterwards it waits until the log has settled (every signed stamp, and every pending stamp
whose process died, in a committed log commit) and checks, per fault:

- **lost 200**: a stamp answered 200 whose commit id (``hashes.log``) or digest
  (``digests.log``) is not on ``main``: must be 0;
- **phantom**: a stamp answered with a failure (503...) that is in the log although the journal
  does not say it was signed: must be 0 (a stamp whose answer was lost in transit, a connection
  error, may be in the log; a stamp that failed may not);
- every 200 is the stamp asked for; ``stampd audit`` of the log (cloned over HTTP) passes;
- the transparency log (`bench.crash_tlog`): every checkpoint ``/tlog/checkpoint`` answered
  during the run is signed by the log key and consistent with the final tree (rebuilt from the
  served entry bundles by pymerkle), and every stamp answered 200 has a proof that verifies and
  whose entry is that stamp.

Exit status 1 if a promise was broken, 2 if the proof could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.crash_tlog import (
    CheckpointWatch,
    ProofCheck,
    TreeReport,
    check_proofs,
    check_tree,
    final_checkpoint,
    proof_path,
    tlog_settled,
)
from bench.proof_http import Conn, HttpError, StampRequest, raise_nofile
from bench.proof_server import TLOG_KEY_ID, ProofError, ProofServer, database, progress

FAULTS = ("api", "http", "worker", "agent", "tlog-worker", "tlog-agent")
TLOG_FAULTS = ("tlog-worker", "tlog-agent")
# After the API process is killed, its stamps left pending are published once no live request
# can be behind them: STAMPD_REQUEST_TIMEOUT + the committer's OUTCOME_GRACE (10 s) after
# their time.
REQUEST_TIMEOUT = 20
OUTCOME_GRACE = 10



@dataclass
class Outcome:
    kind: str
    identity: str
    status: int | None  # None: the request went out and no answer came (lost in transit)
    right: bool = True  # a 200 that is the stamp asked for
    proof: str | None = None  # a 200's proof path (/v1/proofs/...), with the transparency log


@dataclass
class Phase:
    fault: str
    outcomes: list[Outcome] = field(default_factory=list)
    refused: int = 0  # connections that could not be opened (no request sent)
    victim: int | None = None
    recovery_s: float = 0.0
    requeued: int | None = None  # jobs handed to another worker (worker and agent faults)
    orphans: list[int] = field(default_factory=list)  # outlived the killed API process
    lost_200: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    in_log_after_error: int = 0
    note: str = ""  # what the victim was (the log writer...)
    proofs: ProofCheck | None = None

    def row(self, db: str, audit: str) -> str:
        ok = sum(1 for o in self.outcomes if o.status == 200)
        other = Counter(o.status for o in self.outcomes if o.status not in (200, None))
        errors = sum(1 for o in self.outcomes if o.status is None)
        wrong = sum(1 for o in self.outcomes if o.status == 200 and not o.right)
        others = ",".join(f"{s}:{n}" for s, n in sorted(other.items())) or "-"
        requeued = "-" if self.requeued is None else str(self.requeued)
        return (f"{db:8} {self.fault:7} {len(self.outcomes):8} {ok:7} {others:>9} "
                f"{errors:8} {self.refused:7} {wrong:5} {len(self.lost_200):8} "
                f"{len(self.phantoms):7} {self.in_log_after_error:10} {self.recovery_s:8.1f} "
                f"{requeued:>8}  {audit}")


HEADER = (f"{'db':8} {'fault':7} {'requests':>8} {'200':>7} {'other':>9} {'conn-err':>8} "
          f"{'refused':>7} {'wrong':>5} {'lost-200':>8} {'phantom':>7} {'err-in-log':>10} "
          f"{'recov s':>8} {'requeued':>8}  audit")


class Load:
    """``concurrency`` clients stamping until stopped, tag and digest stamps in turn."""

    def __init__(self, port: int, concurrency: int, tlog: bool = False) -> None:
        self.port = port
        self.concurrency = concurrency
        self.tlog = tlog
        self.phase: Phase | None = None
        self.stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, phase: Phase) -> None:
        self.phase = phase
        self.stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.concurrency)]

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self._tasks)

    async def wait_count(self, n: int, timeout: float) -> None:
        assert self.phase is not None
        deadline = time.monotonic() + timeout
        while len(self.phase.outcomes) < n:
            if time.monotonic() > deadline:
                raise ProofError(f"{self.phase.fault}: only {len(self.phase.outcomes)} of {n} "
                                 f"requests in {timeout:.0f} s")
            await asyncio.sleep(0.05)

    async def _client(self, i: int) -> None:
        conn = Conn(self.port, timeout=REQUEST_TIMEOUT + 40)
        phase = self.phase
        assert phase is not None
        n = i
        try:
            while not self.stop.is_set():
                req = StampRequest.new("tag" if n % 2 == 0 else "digest")
                n += 1
                try:
                    answer = await req.send(conn)
                except HttpError as e:
                    if e.sent:
                        phase.outcomes.append(Outcome(req.kind, req.identity, None))
                    else:
                        phase.refused += 1
                    await asyncio.sleep(0.1)
                    continue
                right = answer.status != 200 or req.answered_right(answer)
                proof = (proof_path(req.kind, answer) if self.tlog and answer.status == 200
                         and right else None)
                phase.outcomes.append(Outcome(req.kind, req.identity, answer.status, right,
                                              proof))
        finally:
            conn.close()


def _requeued(ps: ProofServer) -> int:
    value = ps.readyz().get("requeued", 0)
    return int(value) if isinstance(value, int) else 0


def _wait_replaced(ps: ProofServer, processes: Callable[[], list[int]], count: int, victim: int,
                   what: str) -> None:
    """Until another process stands in ``victim``'s place (``count`` of ``processes``, the
    victim not among them) and every worker is in /readyz again; at most 60 s."""
    deadline = time.monotonic() + 60
    while True:
        now = processes()
        if len(now) == count and victim not in now and ps.ready_workers() >= ps.all_workers:
            return
        if time.monotonic() > deadline:
            raise ProofError(f"{what} {victim} was not replaced within 60 s")
        time.sleep(0.05)


def inflict(ps: ProofServer, phase: Phase, rng: random.Random) -> None:
    """Kill the victim and bring back what must come back (blocking: run in a thread)."""
    t0 = time.monotonic()
    if phase.fault == "api":
        phase.victim = ps.api_pid
        phase.orphans = ps.kill_api()
        ps.start()  # waits until /readyz lists every worker
        phase.recovery_s = time.monotonic() - t0
        return
    if phase.fault == "http":
        https = ps.http_pids()
        if len(https) != ps.api_processes or len(https) < 2:
            raise ProofError(f"expected {ps.api_processes} HTTP processes (at least 2), found "
                             f"{https}")
        writer = ps.log_lock_holder()
        phase.victim = writer if writer in https else rng.choice(https)
        phase.note = "the log writer" if writer == phase.victim else "not the log writer"
        os.kill(phase.victim, signal.SIGKILL)
        _wait_replaced(ps, ps.http_pids, ps.api_processes, phase.victim, "HTTP process")
        phase.recovery_s = time.monotonic() - t0
        return
    before = _requeued(ps)
    key = TLOG_KEY_ID if phase.fault in TLOG_FAULTS else None
    count = 1 if key else ps.workers

    def victims() -> list[int]:
        workers = ps.key_worker_pids(key)
        return workers if phase.fault.endswith("worker") else ps.agents_of(workers)

    pids = victims()
    if len(pids) != count:
        raise ProofError(f"expected {count} {phase.fault} processes, found {pids}")
    phase.victim = rng.choice(pids)
    os.kill(phase.victim, signal.SIGKILL)
    _wait_replaced(ps, victims, count, phase.victim, phase.fault)
    phase.recovery_s = time.monotonic() - t0
    phase.requeued = _requeued(ps) - before


@dataclass
class DbRun:
    phases: list[Phase]
    audit: str
    problems: list[str]
    tree: TreeReport | None = None
    watch: CheckpointWatch | None = None


async def run_db(db: str, args: argparse.Namespace, workdir: Path) -> DbRun:
    problems: list[str] = []
    rng = random.Random(f"{args.seed}-{db}")
    tree: TreeReport | None = None
    watch: CheckpointWatch | None = None
    with database(db) as url:
        ps = ProofServer(db, workdir / db, url, workers=args.workers, commit_interval=2.0,
                         api_processes=args.api_processes, tlog=args.tlog,
                         env={"STAMPD_REQUEST_TIMEOUT": f"{args.request_timeout:g}",
                              "STAMPD_MAX_QUEUE": str(args.max_queue),
                              # (INFO: the supervisor's line that starts a worker names its
                              # key, by which the log key's worker is found)
                              "STAMPD_LOG_LEVEL": "INFO"})
        phases = [Phase(f) for f in args.faults]
        try:
            await asyncio.to_thread(ps.start)
            if args.tlog:
                watch = CheckpointWatch(ps.port)
                watch.start()
            load = Load(ps.port, args.concurrency, tlog=args.tlog)
            for phase in phases:
                progress(f"{db}: {phase.fault} fault under c={args.concurrency}")
                load.start(phase)
                try:
                    kill_at = rng.randint(max(1, args.requests // 5), args.requests * 3 // 5)
                    await load.wait_count(kill_at, timeout=300)
                    await asyncio.to_thread(inflict, ps, phase, rng)
                    await load.wait_count(args.requests, timeout=300)
                finally:
                    await load.finish()
                progress(f"{db}: {phase.fault}: {len(phase.outcomes)} requests, victim "
                         f"{phase.victim} {phase.note}, back in {phase.recovery_s:.1f} s")
            wait = args.request_timeout + OUTCOME_GRACE + 30
            progress(f"{db}: waiting for the log to settle (at most {wait} s)")
            ledger = await asyncio.to_thread(ps.ledger, wait)
            if not ledger.settled:
                problems.append(f"{db}: the log did not settle within {wait} s")
            for phase in phases:
                if phase.orphans:
                    problems.append(f"{db} {phase.fault}: processes {phase.orphans} outlived "
                                    "the killed API process by 10 s (killed by PID)")
                for o in phase.outcomes:
                    logged = o.identity in ledger.logged
                    if o.status == 200 and not logged:
                        phase.lost_200.append(f"{o.kind} {o.identity}")
                    elif o.status is None and logged:
                        phase.in_log_after_error += 1
                    elif (o.status not in (200, None) and logged
                          and ledger.states.get(o.identity) != "signed"):
                        phase.phantoms.append(f"{o.kind} {o.identity} ({o.status}, journal "
                                              f"{ledger.states.get(o.identity)})")
                    if o.status == 200 and o.identity not in ledger.states:
                        problems.append(f"{db} {phase.fault}: {o.kind} {o.identity} answered "
                                        "200 but not in the journal")
            progress(f"{db}: {ledger.log_commits} log commits, {len(ledger.logged)} logged; "
                     "running stampd audit")
            ok, audit = await asyncio.to_thread(ps.audit)
            if not ok:
                problems.append(f"{db}: stampd audit failed: {audit}")
            audit = ("PASS " if ok else "FAIL ") + audit
            if watch is not None:
                tree = await check_tlog(db, ps, watch, phases, wait, problems)
        except BaseException:
            print(ps.log_tail(), file=sys.stderr)
            raise
        finally:
            if watch is not None:
                await watch.stop()
            await asyncio.to_thread(ps.stop)
    return DbRun(phases, audit, problems, tree, watch)


async def check_tlog(db: str, ps: ProofServer, watch: CheckpointWatch, phases: list[Phase],
                     wait: float, problems: list[str]) -> TreeReport:
    """The transparency log after the faults: every checkpoint seen consistent with the final
    tree, every stamp answered 200 proven (`bench.crash_tlog`)."""
    progress(f"{db}: waiting for every stamp's entry in the transparency log")
    if not await asyncio.to_thread(tlog_settled, ps.db_url, wait):
        problems.append(f"{db}: not every signed or pending stamp had its entry in {wait} s")
    conn = Conn(ps.port, timeout=30)
    try:
        final = await final_checkpoint(conn, watch, timeout=60)
        await watch.stop()
        tree = await check_tree(conn, watch, final)
    finally:
        conn.close()
    problems += [f"{db}: tlog: {p}" for p in tree.problems]
    for phase in phases:
        stamps = [(o.kind, o.identity, o.proof) for o in phase.outcomes if o.proof is not None]
        unproven = [o for o in phase.outcomes if o.status == 200 and o.right and o.proof is None]
        problems += [f"{db} {phase.fault}: a 200 with no serial: {o.kind} {o.identity}"
                     for o in unproven[:5]]
        phase.proofs = await check_proofs(ps.port, stamps, wait=5.0)
        problems += [f"{db} {phase.fault}: proof: {p}" for p in phase.proofs.problems[:10]]
        if phase.proofs.without_object and phase.fault not in ("api", "http"):
            problems.append(f"{db} {phase.fault}: {phase.proofs.without_object} tag stamp(s) "
                            "answered 200 have an entry without object, though no HTTP process "
                            "died")
    progress(f"{db}: tlog: {tree.checkpoints} checkpoints seen, final size {tree.final_size}, "
             f"{sum(p.proofs.checked for p in phases if p.proofs)} proofs checked")
    return tree


async def main_async(args: argparse.Namespace) -> int:
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    rows: list[str] = []
    tlog_rows: list[str] = []
    problems: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="cr", dir="/tmp"))
    try:
        for db in dbs:
            run = await run_db(db, args, tmp)
            phases, audit = run.phases, run.audit
            problems += run.problems
            if run.tree is not None and run.watch is not None:
                t = run.tree
                tlog_rows.append(
                    f"{db:8} checkpoints seen {t.checkpoints} (polls {run.watch.polls}, "
                    f"unanswered {run.watch.failed}); final tree {t.final_size} entries "
                    f"({', '.join(f'{k} {n}' for k, n in sorted(t.kinds.items()))}; git "
                    f"without object {t.git_without_object}); consistency "
                    + ("ok" if not t.problems else f"{len(t.problems)} PROBLEMS"))
                for p in phases:
                    if p.proofs is not None:
                        tlog_rows.append(
                            f"{db:8} {p.fault:11} proofs checked {p.proofs.checked:6}  "
                            f"verified {p.proofs.verified:6}  entry without object "
                            f"{p.proofs.without_object:4}  found by commit {p.proofs.by_commit:4}  "
                            f"problems {len(p.proofs.problems)}")
            for p in phases:
                rows.append(p.row(db, audit))
                for what, items in (("lost 200", p.lost_200), ("phantom", p.phantoms)):
                    problems += [f"{db} {p.fault}: {what}: {x}" for x in items[:5]]
                wrong = [o for o in p.outcomes if o.status == 200 and not o.right]
                problems += [f"{db} {p.fault}: wrong answer to {o.kind} {o.identity}"
                             for o in wrong[:5]]
    finally:
        if args.keep or problems:
            progress(f"data directories and server logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"crash consistency: kill -9 under c={args.concurrency} (tag and digest stamps in "
          f"turn), >= {args.requests} requests per fault, {args.workers} workers, "
          f"{args.api_processes} HTTP processes, "
          f"STAMPD_MAX_QUEUE={args.max_queue}, STAMPD_REQUEST_TIMEOUT={args.request_timeout:g}, "
          f"transparency log {'on' if args.tlog else 'off'}, seed {args.seed}")
    print(HEADER)
    for r in rows:
        print(r)
    if tlog_rows:
        print("transparency log:")
        for r in tlog_rows:
            print(f"  {r}")
    print("conn-err: request sent, no answer (lost in transit; may be in the log: err-in-log); "
          "refused: connection not opened (nothing sent)")
    if problems:
        print(f"FAIL: {len(problems)} problem(s)")
        for p in problems[:40]:
            print(f"  {p}")
        return 1
    print("PASS: no stamp answered 200 is missing from the log, no failed stamp is in it, "
          "stampd audit passes"
          + ("; every checkpoint seen is signed and consistent with the final tree, every "
             "stamp answered 200 has a proof of its own entry" if args.tlog else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.crash", description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--requests", type=int, default=1000, help="requests per fault (1000)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--api-processes", type=int, default=2,
                    help="HTTP processes (2): the journal written by several at once; the "
                         "http fault needs at least 2")
    ap.add_argument("--max-queue", type=int, default=12,
                    help="STAMPD_MAX_QUEUE (12): below the concurrency, so that some stamps "
                         "fail with 503 (QueueFull) at every fault and the phantom check has "
                         "failures to look at")
    ap.add_argument("--faults", type=lambda s: s.split(","), default=None,
                    help="comma-separated, of " + ",".join(FAULTS) + " (all; without the "
                         "tlog ones with --tlog off)")
    ap.add_argument("--tlog", choices=("on", "off"), default="on",
                    help="the transparency log (on): its key's worker and agent are killed "
                         "too, its checkpoints and proofs checked")
    ap.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT,
                    help="STAMPD_REQUEST_TIMEOUT (20): a stamp left pending by a killed "
                         "process is published this + 10 s after its time")
    ap.add_argument("--seed", type=int, default=1, help="the kills' moments and victims (1)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the data directories and server logs (kept anyway on failure)")
    args = ap.parse_args(argv)
    args.tlog = args.tlog == "on"
    if args.faults is None:
        args.faults = [f for f in FAULTS if args.tlog or f not in TLOG_FAULTS]
    if not args.tlog and any(f in TLOG_FAULTS for f in args.faults):
        ap.error("--faults: the tlog faults need --tlog on")
    if any(f not in FAULTS for f in args.faults):
        ap.error(f"--faults: choose from {','.join(FAULTS)}")
    raise_nofile(4096)
    try:
        return asyncio.run(main_async(args))
    except (ProofError, RuntimeError) as e:  # RuntimeError: a server did not start
        print(f"crash: could not run: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
