"""A sample of `make crash` for the transparency log (bench/crash.py, bench/crash_tlog.py,
bench/README.md): one server on SQLite with the log on and two HTTP processes, a short burst of
tag and digest stamps, kill -9 of the log writer (the HTTP process that sequences the log) and
then of the log key's worker; afterwards every checkpoint seen is signed and consistent with
the final tree (pymerkle, from the served entry bundles) and every stamp answered 200 has a
proof of its own entry. The full runs (every fault, SQLite and PostgreSQL) are `make crash`.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from bench.crash import run_db


def test_the_log_keeps_every_promise_after_kill_9(tmp_path: Path) -> None:
    args = argparse.Namespace(
        requests=60, concurrency=8, workers=2, api_processes=2, max_queue=12,
        faults=["http", "tlog-worker"], tlog=True, request_timeout=5.0, seed=20261126)
    run = asyncio.run(run_db("sqlite", args, tmp_path))  # stops the server by PID
    assert not run.problems, run.problems
    assert run.audit.startswith("PASS"), run.audit
    http, worker = run.phases
    assert http.note == "the log writer", http.note  # the sequencer itself was killed
    assert http.victim is not None and worker.victim is not None
    assert run.tree is not None and run.watch is not None
    for phase in run.phases:
        assert not phase.lost_200 and not phase.phantoms
        assert phase.proofs is not None and not phase.proofs.problems
        answered = sum(1 for o in phase.outcomes if o.status == 200)
        # Not vacuous: stamps were answered in each phase, and each one's proof checked.
        assert answered > 0 and phase.proofs.verified == answered, phase.proofs
    assert run.tree.checkpoints >= 2 and not run.tree.problems
    assert run.tree.final_size == run.tree.entries > 0
