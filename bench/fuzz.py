"""`make fuzz`: generated and mutated requests over every endpoint and method of a real stampd, on
SQLite and then on PostgreSQL, and the promises that must hold whatever arrives (issue 12).

    .venv/bin/python -m bench.fuzz [--requests N] [--db sqlite|postgres|both] [--seed S]

For each database: a fresh server (fixed test key plus an SSH key, 2 signing workers, short
body and keep-alive timeouts, a log commit every few seconds), then ``--requests`` requests
(default 10,000): about ``--schema-share`` of them drawn by schemathesis from the server's own
/openapi.json, the rest from the raw generators (`bench.fuzz_cases`), shuffled, sent over
``--concurrency`` connections at a time. Then, with the log committed:

- no answer ≥ 500, no hang (every request answered or closed within ``--bound`` seconds), no
  malformed answer, no well-formed request closed without an answer, no out-of-order answer,
  no answer that disagrees with the protocol rules, no leak (`bench.fuzz_verdict`);
- no worker restart: the server log has no "worker N exited ... restarting", the metric
  stampd_worker_restarts is 0, the worker processes are those it started with;
- no traceback and no ERROR line in the server's log;
- nothing refused is in the journal (table stamps) or in the log (hashes.log, digests.log of
  every commit on main); everything stamped is in both;
- `stampd audit` of the log, cloned over HTTP, passes, and the server still answers.

It prints a summary per database and exits 1 if any promise broke (2 if it could not run).
The same code runs ~500 requests in tests/system/test_fuzz_sample.py.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.fuzz_cases import Markers, RawGenerator, Target
from bench.fuzz_http import Case, exchange
from bench.fuzz_schema import SchemaUnavailable, schema_cases
from bench.fuzz_server import (
    BODY_TIMEOUT,
    KEEPALIVE_TIMEOUT,
    Ledger,
    LogScan,
    UnderTest,
)
from bench.fuzz_verdict import FAILURE_KINDS, Tally
from bench.proof_server import Postgres, ProofError

HANG_BOUND = 10.0  # seconds; above STAMPD_BODY_TIMEOUT and STAMPD_KEEPALIVE_TIMEOUT
assert 2 * max(BODY_TIMEOUT, KEEPALIVE_TIMEOUT) < HANG_BOUND


def progress(msg: str) -> None:
    print(f"[fuzz {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Options:
    requests: int = 10_000
    seed: int = 1
    schema_share: float = 0.3
    concurrency: int = 16
    bound: float = HANG_BOUND
    workers: int = 2
    keep: bool = False
    settle_timeout: float = 90.0
    require_schema: bool = True


@dataclass
class DbResult:
    db: str
    tally: Tally = field(default_factory=Tally)
    scan: LogScan = field(default_factory=LogScan)
    ledger: Ledger | None = None
    schema_note: str = ""
    metric_restarts: float | None = None
    pids_changed: bool = False
    alive: bool = True
    audit_ok: bool = False
    audit_note: str = ""
    seconds: float = 0.0
    workdir: Path | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def refused_in_journal(self) -> set[str]:
        if self.ledger is None:
            return set()
        return self.tally.refused_markers & self.ledger.values

    @property
    def refused_in_log(self) -> set[str]:
        if self.ledger is None:
            return set()
        return self.tally.refused_markers & self.ledger.log_values

    def judge(self) -> None:
        t = self.tally
        p = self.problems
        for kind in FAILURE_KINDS:
            if t.failures[kind]:
                p.append(f"{kind}: {t.failures[kind]}")
        if self.scan.restarts:
            p.append(f"{self.scan.restarts} worker restart(s) in the server log")
        if self.metric_restarts is None:
            p.append("/metrics has no stampd_worker_restarts")
        elif self.metric_restarts:
            p.append(f"stampd_worker_restarts = {self.metric_restarts:g}")
        if self.pids_changed:
            p.append("the worker processes changed")
        if self.scan.tracebacks:
            p.append(f"{self.scan.tracebacks} traceback(s) in the server log")
        if self.scan.errors:
            p.append(f"{self.scan.errors} ERROR/CRITICAL line(s) in the server log")
        if not self.alive:
            p.append("the server no longer answers /healthz")
        if self.ledger is None:
            p.append("the journal and the log were not read")
        else:
            led = self.ledger
            if not led.settled:
                p.append("not every stamp reached a committed log commit in time")
            p.extend(led.witness_problems())
            if self.refused_in_journal:
                p.append(f"{len(self.refused_in_journal)} refused request(s) in the journal: "
                         f"{sorted(self.refused_in_journal)[:3]}")
            if self.refused_in_log:
                p.append(f"{len(self.refused_in_log)} refused request(s) in the log: "
                         f"{sorted(self.refused_in_log)[:3]}")
            missing = t.accepted - led.values
            if missing:
                p.append(f"{len(missing)} stamped request(s) not in the journal: "
                         f"{sorted(missing)[:3]}")
            unpublished = led.published - led.log_values
            if unpublished:
                p.append(f"{len(unpublished)} signed stamp(s) not in the log: "
                         f"{sorted(unpublished)[:3]}")
        if not self.audit_ok:
            p.append(f"stampd audit failed: {self.audit_note}")


def make_cases(target: Target, base_url: str, opts: Options, result: DbResult) -> list[Case]:
    rng = random.Random(opts.seed)
    n_schema = round(opts.requests * opts.schema_share)
    cases: list[Case] = []
    if n_schema:
        try:
            cases, result.schema_note = schema_cases(base_url, n_schema, opts.seed,
                                                     f"{target.host}:{target.port}")
        except SchemaUnavailable as e:
            result.schema_note = f"schemathesis: no cases: {e}"
            if opts.require_schema:
                result.problems.append(result.schema_note)
    left = opts.requests - sum(len(c.reqs) for c in cases)
    cases += RawGenerator(rng, target, Markers(rng)).cases(left)
    rng.shuffle(cases)
    return cases


async def run_cases(cases: list[Case], host: str, port: int, concurrency: int, bound: float,
                    tally: Tally, report: Callable[[str], None] | None = None) -> None:
    """Send every case (``concurrency`` connections at a time) and judge its outcomes."""
    todo = iter(cases)
    done = 0
    step = max(1, len(cases) // 10)
    started = time.monotonic()

    async def worker() -> None:
        nonlocal done
        for case in todo:
            tally.judge(case, await exchange(host, port, case, bound))
            done += 1
            if report is not None and done % step == 0:
                report(f"{done}/{len(cases)} cases, {tally.total} requests, "
                       f"{time.monotonic() - started:.0f}s")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def fuzz_database(db: str, opts: Options, pg: Postgres | None = None,
                  report: Callable[[str], None] | None = progress) -> DbResult:
    """One server on ``db`` ("sqlite" or "postgres", which needs ``pg``), fuzzed and judged."""
    result = DbResult(db)
    say = report or (lambda _msg: None)
    workdir = Path(tempfile.mkdtemp(prefix="fz", dir="/tmp"))  # short: socket paths
    result.workdir = workdir
    t0 = time.monotonic()
    under: UnderTest | None = None
    try:
        url = pg.database() if pg is not None else None
        under = UnderTest(db, workdir, url, opts.workers)
        say(f"{db}: server on {under.url} (data {under.data})")
        target = under.target()
        cases = make_cases(target, under.url, opts, result)
        say(f"{db}: {len(cases)} cases, {sum(len(c.reqs) for c in cases)} requests"
            + (f"; {result.schema_note}" if result.schema_note else ""))
        asyncio.run(run_cases(cases, target.host, target.port, opts.concurrency, opts.bound,
                              result.tally, report))
        result.alive = under.alive()
        result.metric_restarts = under.metric_restarts()
        result.pids_changed = sorted(under.server.worker_pids()) != under.worker_pids
        say(f"{db}: requests sent; waiting for the log to take every stamp")
        result.ledger = under.ledger(opts.settle_timeout)
        result.audit_ok, result.audit_note = under.audit()
    except (ProofError, RuntimeError) as e:  # RuntimeError: the server did not start
        result.problems.append(f"could not run: {e}")
    finally:
        if under is not None:
            under.stop()
            result.scan = under.scan_log()  # shutdown included
        result.seconds = time.monotonic() - t0
    result.judge()
    if result.ok and not opts.keep:
        shutil.rmtree(workdir, ignore_errors=True)
        result.workdir = None
    return result


def _hist(c: Counter[str]) -> str:
    def order(k: str) -> tuple[int, str]:
        return (0, k) if k.isdigit() else (1, k)

    return "  ".join(f"{k}: {c[k]}" for k in sorted(c, key=order))


def summary(r: DbResult, opts: Options) -> str:
    t = r.tally
    led = r.ledger
    out = [f"== stampd fuzz on {r.db}: {t.total} requests, seed {opts.seed}, "
           f"{r.seconds:.0f} s ==",
           "requests per generator: " + "  ".join(f"{g} {n}" for g, n in
                                                  sorted(t.requests.items())),
           f"schema: {r.schema_note or '-'}",
           "status histogram: " + _hist(t.statuses)]
    for gen in sorted(t.by_generator):
        out.append(f"  {gen:9} " + _hist(t.by_generator[gen]))
    out.append("requests per endpoint (status histogram):")
    for ep in sorted(t.by_endpoint, key=lambda e: (not e.startswith(("/tlog", "/v1/proofs")), e)):
        c = t.by_endpoint[ep]
        fives = sum(n for k, n in c.items() if k.isdigit() and int(k) >= 500)
        out.append(f"  {ep:26} {sum(c.values()):6}  5xx {fives}  " + _hist(c))
    closes = sum(t.allowed_closes.values())
    out.append(f"closed without an answer where the protocol allows it: {closes}")
    for why, n in t.allowed_closes.most_common():
        out.append(f"  {n:6}  {why}")
    out.append(f"5xx: {t.failures['5xx']}   hangs (> {opts.bound:g} s): {t.failures['hang']}   "
               f"slowest answer: {t.slowest:.1f} s")
    out.append("other failures: " + "  ".join(
        f"{k}: {t.failures[k]}" for k in FAILURE_KINDS if k not in ("5xx", "hang")))
    metric = "n/a" if r.metric_restarts is None else f"{r.metric_restarts:g}"
    out.append(f"worker restarts: log {r.scan.restarts}, metric stampd_worker_restarts "
               f"{metric}, worker processes {'changed' if r.pids_changed else 'unchanged'}")
    out.append(f"server log: {r.scan.tracebacks} tracebacks, {r.scan.errors} ERROR lines, "
               f"{r.scan.warnings} warnings ({r.scan.parser_warnings} of them uvicorn's \"Invalid "
               "HTTP request received.\")")
    if led is not None:
        out.append(f"journal: {led.stamps} stamps; stamped markers {len(t.accepted)} "
                   f"(not in the journal: {len(t.accepted - led.values)}); refused markers "
                   f"{len(t.refused_markers)}: in the journal {len(r.refused_in_journal)}, "
                   f"in the log {len(r.refused_in_log)}; unsettled markers "
                   f"{len(t.unsettled)} (not checked)")
        out.append(f"log: {led.log_commits} commits on main, {len(led.log_values)} words in "
                   f"hashes.log/digests.log; signed stamps not in the log: "
                   f"{len(led.published - led.log_values)}"
                   + ("" if led.settled else "; NOT SETTLED"))
    out.append(f"audit: {'ok' if r.audit_ok else 'FAILED'} ({r.audit_note})")
    if t.examples:
        out.append("first failures of each kind:")
        for kind in FAILURE_KINDS:
            out += ["  " + e for e in t.examples.get(kind, [])[:3]]
    if r.scan.examples:
        out.append("server log lines:")
        out += ["  " + e for e in r.scan.examples]
    out.append(f"result on {r.db}: " + ("PASS" if r.ok else "FAIL: " + "; ".join(r.problems)))
    if r.workdir is not None:
        out.append(f"kept {r.workdir} (server log, data directory)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10_000, help="per database (10000)")
    ap.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--schema-share", type=float, default=0.3,
                    help="share of requests drawn from /openapi.json by schemathesis (0.3)")
    ap.add_argument("--concurrency", type=int, default=16, help="connections at a time (16)")
    ap.add_argument("--bound", type=float, default=HANG_BOUND,
                    help=f"seconds after which a request counts as hung ({HANG_BOUND:g})")
    ap.add_argument("--workers", type=int, default=2, help="signing workers (2)")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    args = ap.parse_args(argv)
    opts = Options(requests=args.requests, seed=args.seed, schema_share=args.schema_share,
                   concurrency=args.concurrency, bound=args.bound, workers=args.workers,
                   keep=args.keep)
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    results: list[DbResult] = []
    pg: Postgres | None = None
    try:
        for db in dbs:
            if db == "postgres":
                pg = Postgres()
                pg.start()
            results.append(fuzz_database(db, opts, pg))
            print(summary(results[-1], opts), flush=True)
            print(flush=True)
    except ProofError as e:
        print(f"bench.fuzz: could not run: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if pg is not None:
            pg.stop()
    ok = all(r.ok for r in results)
    print("fuzz: " + ", ".join(f"{r.db} {'PASS' if r.ok else 'FAIL'}" for r in results)
          + f" -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
