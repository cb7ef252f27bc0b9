"""The server under fuzz: a real ``stampd serve`` (tests.helpers.start_server: the fixed test
key, loopback, its own runtime directory, stopped by PID) on SQLite or on a database of a
throwaway PostgreSQL cluster; and what can be seen of it from outside afterwards: its log
(tracebacks, errors, "worker N exited ... restarting"), its metrics (stampd_worker_restarts),
its worker processes, the journal (table ``stamps``), the public log repository (hashes.log,
digests.log of every commit on main) and `stampd audit` of that log, cloned over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.fuzz_cases import WITNESSED, Target
from bench.proof_server import ProofError, read_log
from formats.manifests import unpack
from tests.helpers import (
    TEST_FPR,
    Server,
    seed_data_dir,
    start_server,
)

# Short, so that cases which wait for them stay short; the hang bound lies well above both.
BODY_TIMEOUT = 2
KEEPALIVE_TIMEOUT = 3
COMMIT_INTERVAL = 3

RESTART = re.compile(r"worker \d+ exited .*restarting")
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b")


@dataclass
class LogScan:
    tracebacks: int = 0
    errors: int = 0
    restarts: int = 0
    warnings: int = 0
    parser_warnings: int = 0  # uvicorn: "Invalid HTTP request received."
    examples: list[str] = field(default_factory=list)


@dataclass
class Ledger:
    """The journal and the public log, once every stamp has reached a log commit."""

    stamps: int
    values: set[str]  # every commit, tree, parent, tagname and digest in the journal
    published: set[str]  # commit ids and digests of signed stamps: what the log must show
    log_commits: int
    log_values: set[str]  # every word of hashes.log and digests.log on main
    settled: bool  # every stamp reached a committed log commit in time
    # What the server, as a witness of `bench.fuzz_cases.WITNESSED`, stored: (origin, size,
    # root hash) of each row of witness_logs
    witnessed: list[tuple[str, int, bytes]] = field(default_factory=list)

    def witness_problems(self) -> list[str]:
        """Rows a refused add-checkpoint request could have left: another origin, or a
        root hash that is not the witnessed log's at that size (a fork, a forged tree)."""
        out = []
        for origin, size, root in self.witnessed:
            if origin != WITNESSED.origin:
                out.append(f"the witness stored a checkpoint of an unknown log {origin!r}")
            elif size > len(WITNESSED.hashes) or root != WITNESSED.root(size):
                out.append(f"the witness stored a tree of size {size} that is not the log's")
        return out


class UnderTest:
    """One server on one database."""

    def __init__(self, db: str, workdir: Path, database_url: str | None, workers: int,
                 ssh_key: bool = True, tlog: bool = True,
                 extra_env: dict[str, str] | None = None, extra_workers: int = 0) -> None:
        """``extra_env``: more settings (`bench.fuzz_mail`: the mail listener), which bring
        ``extra_workers`` more workers (the mail key's)."""
        self.db = db
        self.workdir = workdir
        self.data = seed_data_dir(workdir / "data")
        self.tlog = tlog
        # The transparency log on (its key adds a worker): its reads are fuzzed too.
        env = {"STAMPD_BODY_TIMEOUT": str(BODY_TIMEOUT),
               "STAMPD_KEEPALIVE_TIMEOUT": str(KEEPALIVE_TIMEOUT),
               "STAMPD_TLOG": "on" if tlog else "off",
               # a witness of one log, whose add-checkpoint requests are fuzzed too (all of
               # them checked: no per-client budget, which would answer most of them 429)
               "STAMPD_WITNESS_FOR": WITNESSED.vkey,
               "STAMPD_WITNESS_REQUESTS_PER_CLIENT_MINUTE": "0"}
        if ssh_key:  # a second key, so that format=ssh and key=SHA256:... can be accepted
            env.update(STAMPD_EXTRA_KEYS="ssh:ed25519", STAMPD_EXTRA_KEY_WORKERS="1")
        env.update(extra_env or {})
        self.db_url = database_url or f"sqlite:///{self.data / 'stampd.sqlite3'}"
        self.server: Server = start_server(self.data, workers=workers,
                                           commit_interval=COMMIT_INTERVAL,
                                           database_url=database_url, extra_env=env,
                                           runtime_dir=workdir / "rt")
        try:
            self.server.wait_ready(workers + (1 if ssh_key else 0) + (1 if tlog else 0) + 1
                                   + extra_workers)
        except BaseException:
            self.stop()
            raise
        self.worker_pids = sorted(self.server.worker_pids())

    @property
    def url(self) -> str:
        return self.server.url

    def get(self, path: str, accept: str = "*/*") -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path.lstrip("/"), headers={"Accept": accept})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def target(self) -> Target:
        status, body = self.get("/v1/keys")
        if status != 200:
            raise ProofError(f"GET /v1/keys answered {status}")
        keys = json.loads(body)["keys"]
        primary = next(k["fingerprint"] for k in keys if k["primary"])
        if primary != TEST_FPR:
            raise ProofError(f"the primary key is {primary}, not the test key")
        ssh = tuple(k["fingerprint"] for k in keys if k["format"] == "ssh"
                    and k.get("purpose", "stamps") == "stamps")
        if not self.tlog:
            return Target("127.0.0.1", self.server.port, primary, ssh)
        serials, git_ids, size = self.seed_tlog()
        return Target("127.0.0.1", self.server.port, primary, ssh, serials, git_ids, size)

    def post(self, path: str, fields: dict[str, str]) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path.lstrip("/"),
                                     data=urllib.parse.urlencode(fields).encode(),
                                     headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def seed_tlog(self) -> tuple[tuple[int, ...], tuple[str, ...], int]:
        """A few stamps whose proofs are ready before the fuzzing starts, so that the
        generators can ask for proofs that exist: (their serials, their tags' object ids,
        the tree size then)."""
        serials: list[int] = []
        git_ids: list[str] = []
        for i in range(3):
            digest = hashlib.sha256(b"fuzz tlog seed %d %s" % (i, self.data.name.encode())
                                    ).hexdigest()
            status, body = self.post("/v1/stamps", {"sha256": digest})
            if status != 200:
                raise ProofError(f"seed digest stamp answered {status}: {body[:200]!r}")
            serials.append(int(json.loads(body)["serial"]))
            commit = hashlib.sha1(b"fuzz tlog seed %d %s" % (i, self.data.name.encode())
                                  ).hexdigest()
            status, tag = self.post("/", {"request": "stamp-tag-v1", "commit": commit,
                                          "tagname": f"seed{i}"})
            if status != 200:
                raise ProofError(f"seed tag stamp answered {status}: {tag[:200]!r}")
            git_ids.append(hashlib.sha1(b"tag %d\0" % len(tag) + tag).hexdigest())
        for path in [f"/v1/proofs/{s}?wait=30" for s in serials] + [
                f"/v1/proofs/git/{g}?wait=30" for g in git_ids]:
            status, body = self.get(path)
            if status != 200:
                raise ProofError(f"GET {path} answered {status}: {body[:200]!r}")
        status, note = self.get("/tlog/checkpoint")
        if status != 200:
            raise ProofError(f"GET /tlog/checkpoint answered {status}")
        size = int(note.split(b"\n")[1])
        return tuple(serials), tuple(git_ids), size

    def metric_restarts(self) -> float | None:
        status, body = self.get("/metrics")
        if status != 200:
            return None
        m = re.search(rb"^stampd_worker_restarts_total (\S+)$", body, re.MULTILINE)
        return float(m.group(1)) if m else None

    def alive(self) -> bool:
        try:
            return self.get("/healthz")[0] == 200 and self.server.proc.poll() is None
        except OSError:
            return False

    def scan_log(self) -> LogScan:
        scan = LogScan()
        try:
            text = self.server.log_path.read_text(errors="replace")
        except OSError:
            return scan
        for line in text.splitlines():
            hit = False
            if "Traceback" in line:
                scan.tracebacks += 1
                hit = True
            if RESTART.search(line):
                scan.restarts += 1
                hit = True
            if ERROR_LINE.search(line):
                scan.errors += 1
                hit = True
            if "WARNING" in line:
                scan.warnings += 1
                if "Invalid HTTP request received." in line:
                    scan.parser_warnings += 1
            if hit and len(scan.examples) < 10:
                scan.examples.append(line[:300])
        return scan

    def ledger(self, timeout: float) -> Ledger:
        """Wait until every stamp is in a committed log commit (the log committer runs every
        COMMIT_INTERVAL seconds), then read the journal and the log."""
        from sqlalchemy import create_engine, text

        engine = create_engine(self.db_url)
        try:
            deadline = time.monotonic() + timeout
            settled = False
            while True:
                with engine.connect() as conn:
                    waiting = conn.execute(text(
                        "select count(*) from stamps where log_commit_id is null and "
                        "state in ('signed', 'pending', 'orphaned')")).scalar_one()
                    pending = conn.execute(text(
                        "select count(*) from log_commits where state = 'pending'")).scalar_one()
                if waiting == 0 and pending == 0:
                    settled = True
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            with engine.connect() as conn:
                rows = conn.execute(text(
                    'select "commit", tree, parent, tagname, digest, state from stamps'
                )).all()
                # a manifest's digests are kept packed by bucket, beside its stamp
                packed = conn.execute(text(
                    "select m.algorithm, m.digests, s.state from manifest_digests m "
                    "join stamps s on s.id = m.stamp_id")).all()
                witnessed = [(o, n, bytes(r)) for o, n, r in conn.execute(text(
                    "select origin, size, root_hash from witness_logs")).all()]
        finally:
            engine.dispose()
        values: set[str] = set()
        published: set[str] = set()
        for commit, tree, parent, tagname, digest, state in rows:
            values |= {v for v in (commit, tree, parent, tagname, digest) if v}
            if state == "signed":
                published |= {v for v in (commit, digest) if v}
        for algorithm, digests, state in packed:
            unpacked = set(unpack(bytes(digests), hashlib.new(algorithm).digest_size))
            values |= unpacked
            if state == "signed":
                published |= unpacked
        commits, log_values = read_log(self.data / "log.git")
        return Ledger(len(rows), values, published, commits, log_values, settled, witnessed)

    def audit(self) -> tuple[bool, str]:
        """`stampd audit` of the log as anyone would run it: cloned from /log.git."""
        from client.audit import audit, local_copy
        from client.errors import CommandError

        url = self.url + "log.git"
        try:
            with local_copy(url) as path:
                report = audit(path, None, target=url)
        except CommandError as e:
            return False, f"audit could not run: {e}"
        lines = report.render().splitlines()
        head = "; ".join(ln for ln in lines[1:3])
        if report.fingerprint != TEST_FPR:
            return False, f"log signed by {report.fingerprint}, not the server key; {head}"
        if not report.ok:
            return False, "; ".join(str(f) for f in report.failures[:5])
        return True, f"{len(report.log)} log commits; {head}"

    def stop(self) -> None:
        try:
            self.server.stop()
        finally:
            shutil.rmtree(self.server.runtime_dir, ignore_errors=True)
