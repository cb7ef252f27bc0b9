"""The log committer in-process, with an injected clock: nothing sleeps, nothing is timed.

Real parts throughout: stamps are recorded by the real `Journal` into a migrated SQLite file,
log commits are signed by the real `OpenPgpSigner` over a real gpg-agent (through
`InProcessDispatcher`, see conftest.py), written by the real `LogRepository`, and checked with
the real ``git``. The subprocess version of these checks is tests/system/test_log.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pygit2
import pytest
from sqlalchemy import Engine, insert, select, update

from formats.jobs import CommitJob
from server import db
from server.gitlog.committer import OUTCOME_GRACE, CommitterConfig, LogCommitter
from server.gitlog.repository import LogRepository
from server.models import LogCommit, LogCommitState, Stamp, StampState
from server.stamping.journal import Journal
from server.stamping.requests import BranchRequest, DigestRequest, Request, TagRequest
from tests.helpers import (
    TEST_FPR,
    TEST_PUBLIC_KEY,
    TEST_UID,
    InProcessDispatcher,
    keyring,
    migrated_sqlite,
)
from workers.signer import OpenPgpSigner

# The injected clock starts here: after the test key was made (gpg refuses signatures older
# than their key), and fixed, so that commit times and messages are known exactly.
T0 = 1_795_400_000  # 2026-11-23 02:13:20 UTC
PUBKEY = TEST_PUBLIC_KEY.read_text()
TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
REQUEST_TIMEOUT = 20
# A pending stamp this many seconds old (and no more) may still get its outcome recorded.
OLD = REQUEST_TIMEOUT + OUTCOME_GRACE


class Clock:
    """A manual clock: ``clock()`` reads it, ``advance`` moves it."""

    def __init__(self, t: float = T0) -> None:
        self.t = [float(t)]

    def __call__(self) -> float:
        return self.t[0]

    def advance(self, seconds: float) -> int:
        self.t[0] += seconds
        return int(self.t[0])


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = db.make_engine(migrated_sqlite(tmp_path / "stampd.sqlite3"))
    yield eng
    eng.dispose()


@pytest.fixture
def repo(tmp_path: Path) -> LogRepository:
    return LogRepository(tmp_path / "log.git")


@pytest.fixture
def gnupg_home(tmp_path: Path) -> Path:
    """A GNUPGHOME that knows only the test public key (for git verify-commit)."""
    return keyring(TEST_PUBLIC_KEY, tmp_path / "g")


def make_committer(engine: Engine, repo: LogRepository, dispatcher: InProcessDispatcher,
                   clock: Callable[[], float], heads: list[str] | None = None,
                   interval: float = 3600, pubkey: str = PUBKEY,
                   peer_keys: Callable[[], dict[str, str]] | None = None,
                   key_files: dict[str, str] | None = None,
                   settle: float = 0) -> LogCommitter:
    config = CommitterConfig(pubkey, interval, key_files or {}, request_timeout=REQUEST_TIMEOUT,
                             settle=settle, clock=clock)
    return LogCommitter(engine, repo, dispatcher, config,
                        on_commit=None if heads is None else heads.append, peer_keys=peer_keys)


async def record(engine: Engine, reqs: list[Request], t: int,
                 outcome: str = StampState.SIGNED) -> list[int]:
    """Journal the requests (as the stamping path does before signing), then record their
    outcome as the stamping path does after it (``pending``: none, as if the process died or
    were still signing); their stamp ids."""
    journal = Journal(engine)
    journal.start()
    try:
        ids = list(await asyncio.gather(*(journal.record(r, t) for r in reqs)))
        await outcomes(journal, ids, outcome)
        return ids
    finally:
        await journal.stop()  # writes the outcomes still waiting


async def outcomes(journal: Journal, ids: list[int], outcome: str) -> None:
    for sid in ids:
        if outcome == StampState.SIGNED:
            journal.signed(sid, "w1", 1, None)
        elif outcome == StampState.FAILED:
            journal.failed(sid, "timed out")
        else:
            assert outcome == StampState.PENDING


async def late_outcome(engine: Engine, ids: list[int], outcome: str) -> None:
    """An outcome recorded after the stamp was journaled by another `record` call."""
    journal = Journal(engine)
    journal.start()
    try:
        await outcomes(journal, ids, outcome)
    finally:
        await journal.stop()


def tag(n: int) -> TagRequest:
    return TagRequest(f"{n:040x}", "t")


def commit_of(repo: LogRepository, oid: str) -> pygit2.Commit:
    c = repo.repo[oid]
    assert isinstance(c, pygit2.Commit)
    return c


def blob(commit: pygit2.Commit, path: str) -> bytes:
    obj = commit.tree[path]
    assert isinstance(obj, pygit2.Blob)
    return obj.data


def main_history(repo: LogRepository) -> list[str]:
    head = repo.head()
    if head is None:
        return []
    return [str(c.id) for c in repo.repo.walk(head, pygit2.enums.SortMode.TOPOLOGICAL)]


def verify_commit(git_dir: Path, oid: str, home: Path) -> tuple[str, int]:
    """``git verify-commit`` with the real git; (signing key fingerprint, signature time)."""
    r = subprocess.run(["git", "--git-dir", str(git_dir), "verify-commit", "--raw", oid],
                       capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "GNUPGHOME": str(home)})
    assert r.returncode == 0, r.stderr
    fields = next(line.split() for line in r.stderr.splitlines()
                  if line.startswith("[GNUPG:] VALIDSIG "))
    return fields[2], int(fields[4])


def fsck(git_dir: Path) -> None:
    r = subprocess.run(["git", "--git-dir", str(git_dir), "fsck", "--strict"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def log_rows(engine: Engine) -> list[tuple[int, str, str | None, int]]:
    with engine.connect() as conn:
        rows = conn.execute(select(LogCommit.id, LogCommit.state, LogCommit.git_commit,
                                   LogCommit.hash_count).order_by(LogCommit.id))
        return [(r.id, r.state, r.git_commit, r.hash_count) for r in rows]


def assigned(engine: Engine) -> dict[int, int | None]:
    """stamp id -> log commit id."""
    with engine.connect() as conn:
        rows = conn.execute(select(Stamp.id, Stamp.log_commit_id))
        return {r.id: r.log_commit_id for r in rows}


def states(engine: Engine) -> dict[int, str]:
    """stamp id -> state."""
    with engine.connect() as conn:
        return {r.id: r.state for r in conn.execute(select(Stamp.id, Stamp.state))}


def logged(repo: LogRepository, oid: str) -> tuple[bytes, bytes | None]:
    """(hashes.log, digests.log or None) of a log commit."""
    c = commit_of(repo, oid)
    return blob(c, "hashes.log"), blob(c, "digests.log") if "digests.log" in c.tree else None


def rebuilt_identically(engine: Engine, repo: LogRepository, other_dir: Path,
                        dispatcher: InProcessDispatcher, clock: Clock) -> None:
    """Another host rebuilds every log commit from the rows alone, to the same ids."""
    other = LogRepository(other_dir / "log.git")
    reader = make_committer(engine, other, dispatcher, clock)
    assert reader.sync_from_db() == len(main_history(repo))
    assert main_history(other) == main_history(repo)
    for oid in main_history(repo):
        assert commit_of(other, oid).tree_id == commit_of(repo, oid).tree_id


# ---------------------------------------------------------------------------------------------


def test_first_log_commit_is_signed_sorted_and_clocked(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
    gnupg_home: Path,
) -> None:
    clock = Clock()
    heads: list[str] = []
    committer = make_committer(engine, repo, inproc_dispatcher, clock, heads)
    reqs: list[Request] = [
        tag(5), tag(3), BranchRequest(f"{9:040x}", TREE), tag(3),  # 3 twice
        DigestRequest("sha256", "b" * 64), DigestRequest("sha512", "a" * 128),
        DigestRequest("sha256", "b" * 64),  # twice
    ]

    async def scenario() -> str | None:
        ids = await record(engine, reqs, T0)
        assert len(set(ids)) == len(reqs)
        clock.advance(100)
        return await committer.commit_now()

    head = asyncio.run(scenario())
    assert head is not None and repo.head() == head
    assert heads == [head]  # on_commit saw the new head

    c = commit_of(repo, head)
    assert c.parents == []
    assert blob(c, "hashes.log") == "".join(
        f"{n:040x}\n" for n in (3, 5, 9)).encode()  # sorted, unique, git stamps only
    assert blob(c, "digests.log") == f"sha256 {'b' * 64}\nsha512 {'a' * 128}\n".encode()
    assert blob(c, "pubkey.asc") == TEST_PUBLIC_KEY.read_bytes()
    assert sorted(str(e.name) for e in c.tree) == ["digests.log", "hashes.log", "pubkey.asc"]
    # Time and message come from the injected clock, not from the wall clock.
    assert c.commit_time == c.author.time == T0 + 100
    assert f"{c.committer.name} <{c.committer.email}>" == TEST_UID
    assert c.message == ("stampd log commit 1\n\n"
                         "5 hashes stamped until 2026-11-23 02:15:00 UTC\n")
    assert inproc_dispatcher.jobs == [CommitJob(str(c.tree_id), (), T0 + 100, c.message)]
    assert inproc_dispatcher.internal == [True]  # (the service's own: not refused when busy)

    # The real git accepts the signature, made by the test key at the injected time.
    assert verify_commit(repo.path, head, gnupg_home) == (TEST_FPR, T0 + 100)
    fsck(repo.path)

    assert log_rows(engine) == [(1, LogCommitState.COMMITTED, head, 5)]
    assert set(assigned(engine).values()) == {1}
    with engine.connect() as conn:
        raw, files = conn.execute(select(LogCommit.raw, LogCommit.files)).one()
    assert raw is not None and raw.encode() == repo.repo.odb.read(c.id)[1]
    assert files is not None and json.loads(files) == {"pubkey.asc": PUBKEY}


def test_nothing_new_commits_nothing_then_next_commit_chains(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
    gnupg_home: Path,
) -> None:
    clock = Clock()
    heads: list[str] = []
    committer = make_committer(engine, repo, inproc_dispatcher, clock, heads)

    async def scenario() -> tuple[str | None, str | None, str | None]:
        await record(engine, [tag(1), tag(2)], T0)
        first = await committer.commit_now()
        clock.advance(3600)
        idle = await committer.commit_now()  # no stamps since: no (empty) commit
        await record(engine, [tag(0xF), DigestRequest("sha256", "c" * 64)], int(clock()))
        clock.advance(3600)
        second = await committer.commit_now()
        return first, idle, second

    first, idle, second = asyncio.run(scenario())
    assert first is not None and second is not None
    assert idle is None
    assert len(inproc_dispatcher.jobs) == 2  # nothing was signed for the idle run
    assert heads == [first, second]
    assert main_history(repo) == [second, first]

    c = commit_of(repo, second)
    assert [str(p) for p in c.parent_ids] == [first]
    assert blob(c, "hashes.log") == f"{0xF:040x}\n".encode()  # only the new stamps
    assert blob(c, "digests.log") == f"sha256 {'c' * 64}\n".encode()
    assert "digests.log" not in commit_of(repo, first).tree  # the first period had none
    assert c.commit_time == T0 + 7200
    assert c.message.startswith("stampd log commit 2\n\n2 hashes stamped until ")
    for oid, t in ((first, T0), (second, T0 + 7200)):
        assert verify_commit(repo.path, oid, gnupg_home) == (TEST_FPR, t)
    assert log_rows(engine) == [(1, LogCommitState.COMMITTED, first, 2),
                                (2, LogCommitState.COMMITTED, second, 2)]
    assert Counter(assigned(engine).values()) == {1: 2, 2: 2}


async def run_loop(committer: LogCommitter, until: Callable[[], bool]) -> None:
    """The committer's own loop, until ``until`` holds (within 60 s)."""
    committer.start()
    try:
        async with asyncio.timeout(60):  # a guard against a hang, not a measurement
            while not until():
                await asyncio.sleep(0)
    finally:
        await committer.stop()


def test_overdue_follows_the_injected_clock(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
) -> None:
    clock = Clock()
    committer = make_committer(engine, repo, inproc_dispatcher, clock, interval=60)
    assert not committer.overdue()  # just started
    clock.advance(2 * 60 + 30)
    assert not committer.overdue()  # the bound itself is not yet overdue
    clock.advance(1)
    assert committer.overdue()

    # One successful run of the committer's own loop clears it (with interval 0 the loop's
    # wait is a bare yield; its first pass has nothing to commit, which counts as success).
    loop_committer = make_committer(engine, repo, inproc_dispatcher, clock, interval=0)
    clock.advance(31)
    assert loop_committer.overdue()

    asyncio.run(run_loop(loop_committer, lambda: loop_committer.last_ok_at is not None))
    assert loop_committer.last_ok_at == clock()
    assert loop_committer.last_error is None
    assert not loop_committer.overdue()
    clock.advance(31)
    assert loop_committer.overdue()
    assert repo.head() is None  # nothing was stamped, so nothing was committed


def test_a_log_commit_no_worker_signs_is_a_warning_line_and_tried_again(
    engine: Engine, repo: LogRepository, openpgp_signer: OpenPgpSigner,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No worker holds the key (the workers restarting): each interval says so in one line,
    no traceback, and commits nothing; the stamps wait for the next interval."""
    clock = Clock()
    dispatcher = InProcessDispatcher(openpgp_signer, key="no such key")
    committer = make_committer(engine, repo, dispatcher, clock, interval=0)

    asyncio.run(record(engine, [tag(1)], T0))
    with caplog.at_level("WARNING", logger="server.gitlog.committer"):
        asyncio.run(run_loop(committer, lambda: committer.last_error is not None))
    assert committer.last_error is not None
    assert committer.last_error.startswith("NotSigned: could not sign log commit 1: ")
    records = [r for r in caplog.records if r.name == "server.gitlog.committer"]
    assert records and all(r.levelname == "WARNING" and r.exc_info is None for r in records)
    assert records[0].getMessage() == (
        "could not sign log commit 1: no worker holds key primary; "
        "retrying at the next interval")
    assert repo.head() is None and committer.last_ok_at is None


def test_pending_row_is_finished_after_a_crash(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
    gnupg_home: Path,
) -> None:
    """A crash after step 1 (stamps assigned to a pending row, nothing written to git): the
    next run commits those stamps under the row's number, once."""
    clock = Clock()
    crashed = make_committer(engine, repo, inproc_dispatcher, clock)

    async def before() -> int | None:
        await record(engine, [tag(11), tag(12), tag(13)], T0)
        return await asyncio.to_thread(crashed._assign)  # step 1, then the process dies

    pending = asyncio.run(before())
    assert pending is not None
    assert log_rows(engine) == [(pending, LogCommitState.PENDING, None, 0)]
    assert set(assigned(engine).values()) == {pending}
    assert repo.head() is None

    heads: list[str] = []
    clock.advance(60)
    restarted = make_committer(engine, repo, inproc_dispatcher, clock, heads)
    head = asyncio.run(restarted.commit_now())
    assert head is not None and heads == [head] and main_history(repo) == [head]
    c = commit_of(repo, head)
    assert c.message.startswith(f"stampd log commit {pending}\n\n3 hashes ")
    assert blob(c, "hashes.log") == "".join(f"{n:040x}\n" for n in (11, 12, 13)).encode()
    assert verify_commit(repo.path, head, gnupg_home) == (TEST_FPR, T0 + 60)
    assert log_rows(engine) == [(pending, LogCommitState.COMMITTED, head, 3)]

    # Nothing left over: another run neither commits again nor makes a new row.
    assert asyncio.run(restarted.commit_now()) is None
    assert main_history(repo) == [head] and len(log_rows(engine)) == 1


def test_commit_written_but_row_pending_is_only_marked(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
) -> None:
    """A crash after step 2 (the git commit is written, the row still pending): the next run
    marks the row with that commit instead of committing the stamps twice, and goes on."""
    clock = Clock()
    first_run = make_committer(engine, repo, inproc_dispatcher, clock)

    async def before() -> str | None:
        await record(engine, [tag(21), tag(22)], T0)
        return await first_run.commit_now()

    written = asyncio.run(before())
    assert written is not None
    with engine.begin() as conn:  # undo step 3, as if the process died before it
        conn.execute(update(LogCommit).values(state=LogCommitState.PENDING, git_commit=None,
                                              hash_count=0, raw=None, files=None))
    signed_before = len(inproc_dispatcher.jobs)

    heads: list[str] = []
    clock.advance(3600)
    restarted = make_committer(engine, repo, inproc_dispatcher, clock, heads)

    async def after() -> tuple[str | None, str | None]:
        recovered = await restarted.commit_now()
        await record(engine, [tag(23)], int(clock()))
        return recovered, await restarted.commit_now()

    recovered, nxt = asyncio.run(after())
    assert recovered == written  # the existing commit, not a second one
    assert len(inproc_dispatcher.jobs) == signed_before + 1  # only the next commit was signed
    assert nxt is not None and heads == [written, nxt]
    assert main_history(repo) == [nxt, written]
    assert blob(commit_of(repo, nxt), "hashes.log") == f"{23:040x}\n".encode()
    assert log_rows(engine) == [(1, LogCommitState.COMMITTED, written, 2),
                                (2, LogCommitState.COMMITTED, nxt, 1)]


def test_sync_from_db_rebuilds_the_log_with_identical_ids(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
    tmp_path: Path, gnupg_home: Path,
) -> None:
    """Another host taking over the log rebuilds every commit from the rows alone."""
    clock = Clock()
    peers = {"bee": PUBKEY}
    key_files = {"keys/extra.asc": "an extra public key\n", "allowed_signers": "x ssh-ed25519\n"}
    writer = make_committer(engine, repo, inproc_dispatcher, clock, peer_keys=lambda: peers,
                            key_files=key_files)

    async def write_log() -> list[str]:
        out = []
        batches: list[list[Request]] = [[tag(1), DigestRequest("sha256", "d" * 64)], [tag(2)],
                                        [tag(3)]]
        for batch in batches:
            await record(engine, batch, int(clock()))
            clock.advance(3600)
            head = await writer.commit_now()
            assert head is not None
            out.append(head)
        return out

    written = asyncio.run(write_log())
    assert main_history(repo) == written[::-1]

    other = LogRepository(tmp_path / "other" / "log.git")
    # Given the wrong public key on purpose: the rows' recorded files must win.
    reader = make_committer(engine, other, inproc_dispatcher, clock, pubkey="not the key")
    signed_before = len(inproc_dispatcher.jobs)
    assert reader.sync_from_db() == 3
    assert len(inproc_dispatcher.jobs) == signed_before  # rebuilt, not re-signed
    assert main_history(other) == main_history(repo)
    for oid in written:
        assert other.repo.odb.read(oid)[1] == repo.repo.odb.read(oid)[1]
        assert commit_of(other, oid).tree_id == commit_of(repo, oid).tree_id
    newest = commit_of(other, written[-1])
    peers_tree = newest.tree["peers"]
    assert isinstance(peers_tree, pygit2.Tree)
    assert [e.name for e in peers_tree] == ["bee.asc"]
    assert blob(newest, "keys/extra.asc") == b"an extra public key\n"
    assert blob(newest, "pubkey.asc") == TEST_PUBLIC_KEY.read_bytes()
    assert verify_commit(other.path, written[-1], gnupg_home)[0] == TEST_FPR
    fsck(other.path)

    assert reader.sync_from_db() == 0  # already in step
    # A commit the other host has not seen is added on top.
    asyncio.run(record(engine, [tag(4)], int(clock())))
    fourth = asyncio.run(writer.commit_now())
    assert fourth is not None
    assert reader.sync_from_db() == 1 and other.head() == fourth


# -- which stamps the log shows: exactly those that were (or may have been) signed ----------


def test_failed_stamps_are_left_out_of_the_log(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
    tmp_path: Path,
) -> None:
    """A stamp that failed (the client got a 503, nothing signed reached anyone) is not
    published, neither a git stamp in hashes.log nor a digest in digests.log, nor counted."""
    clock = Clock()
    committer = make_committer(engine, repo, inproc_dispatcher, clock)
    a, b, c = "a" * 64, "b" * 64, "c" * 128

    async def scenario() -> str | None:
        await record(engine, [tag(1), DigestRequest("sha256", a)], T0)
        await record(engine, [tag(2), DigestRequest("sha256", b), DigestRequest("sha512", c),
                              tag(1)],  # the same commit once more, failed this time
                     T0, StampState.FAILED)
        clock.advance(60)
        return await committer.commit_now()

    head = asyncio.run(scenario())
    assert head is not None
    assert logged(repo, head) == (f"{1:040x}\n".encode(), f"sha256 {a}\n".encode())
    assert commit_of(repo, head).message.startswith("stampd log commit 1\n\n2 hashes stamped ")
    assert log_rows(engine) == [(1, LogCommitState.COMMITTED, head, 2)]
    # Every stamp was considered by this log commit, failed ones too (never again).
    assert set(assigned(engine).values()) == {1}
    assert Counter(states(engine).values()) == {StampState.SIGNED: 2,
                                                StampState.FAILED_UNLOGGED: 4}
    assert asyncio.run(committer.commit_now()) is None
    rebuilt_identically(engine, repo, tmp_path / "other", inproc_dispatcher, clock)


def test_a_period_of_failed_stamps_only_commits_nothing(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
) -> None:
    clock = Clock()
    committer = make_committer(engine, repo, inproc_dispatcher, clock)

    async def scenario() -> tuple[str | None, list[int], str | None]:
        failed = await record(engine, [tag(3), DigestRequest("sha256", "3" * 64)], T0,
                              StampState.FAILED)
        clock.advance(3600)
        nothing = await committer.commit_now()
        assert log_rows(engine) == []  # no row, so no number is used up
        assert set(assigned(engine).values()) == {None}
        await record(engine, [tag(4)], int(clock()))
        clock.advance(60)
        return nothing, failed, await committer.commit_now()

    nothing, failed, head = asyncio.run(scenario())
    assert nothing is None
    assert head is not None and main_history(repo) == [head]
    assert logged(repo, head) == (f"{4:040x}\n".encode(), None)  # no digests.log at all
    assert log_rows(engine) == [(1, LogCommitState.COMMITTED, head, 1)]
    assert {assigned(engine)[i] for i in failed} == {1}  # taken along, not published
    assert len(inproc_dispatcher.jobs) == 1


def test_young_pending_stamps_wait_for_their_outcome(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
    tmp_path: Path,
) -> None:
    """A pending stamp may still fail: it is left for a later log commit, even when newer
    stamps (higher ids) are committed, and goes into the first one after its outcome."""
    clock = Clock()
    committer = make_committer(engine, repo, inproc_dispatcher, clock)

    async def scenario() -> tuple[list[str | None], list[int]]:
        signing = await record(engine, [tag(5), DigestRequest("sha256", "5" * 64)], T0,
                               StampState.PENDING)
        failing = await record(engine, [tag(6)], T0, StampState.PENDING)
        await record(engine, [tag(7)], T0)
        clock.advance(OLD)  # not more: any of them may still get its outcome
        heads = [await committer.commit_now()]
        await late_outcome(engine, signing, StampState.SIGNED)
        await late_outcome(engine, failing, StampState.FAILED)
        clock.advance(1)
        heads.append(await committer.commit_now())
        heads.append(await committer.commit_now())
        return heads, signing + failing

    (first, second, third), late = asyncio.run(scenario())
    assert first is not None and second is not None and third is None
    assert logged(repo, first) == (f"{7:040x}\n".encode(), None)
    assert logged(repo, second) == (f"{5:040x}\n".encode(), f"sha256 {'5' * 64}\n".encode())
    assert log_rows(engine) == [(1, LogCommitState.COMMITTED, first, 1),
                                (2, LogCommitState.COMMITTED, second, 2)]
    assert [assigned(engine)[i] for i in late] == [2, 2, 2]
    rebuilt_identically(engine, repo, tmp_path / "other", inproc_dispatcher, clock)


def test_pending_stamps_of_a_dead_process_are_published_once_old(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
    tmp_path: Path,
) -> None:
    """A process killed between signing and recording the outcome leaves its stamps pending,
    and their signatures may have reached clients: once no live request can be behind them
    any more (older than the request timeout plus a grace), they are published, and their
    rows say so: ``orphaned``, no longer ``pending``."""
    clock = Clock()
    committer = make_committer(engine, repo, inproc_dispatcher, clock)

    async def scenario() -> tuple[str | None, str | None, list[int]]:
        orphans = await record(engine, [tag(8), DigestRequest("sha512", "8" * 128)], T0,
                               StampState.PENDING)
        young = await record(engine, [tag(9)], T0 + 1, StampState.PENDING)
        clock.advance(OLD)
        early = await committer.commit_now()
        assert states(engine) == dict.fromkeys(orphans + young, StampState.PENDING)
        clock.advance(1)
        return early, await committer.commit_now(), orphans

    early, head, orphans = asyncio.run(scenario())
    assert early is None
    assert head is not None
    assert logged(repo, head) == (f"{8:040x}\n".encode(), f"sha512 {'8' * 128}\n".encode())
    assert log_rows(engine) == [(1, LogCommitState.COMMITTED, head, 2)]
    # (the younger one may still get its outcome: left pending and unassigned)
    assert states(engine) == {**dict.fromkeys(orphans, StampState.ORPHANED),
                              3: StampState.PENDING}
    assert assigned(engine) == {**dict.fromkeys(orphans, 1), 3: None}

    # Should an outcome still arrive (a process that was only stalled, or another host whose
    # clock is behind), what was published stays published: the rows rebuild the same log.
    asyncio.run(late_outcome(engine, orphans[:1], StampState.SIGNED))
    asyncio.run(late_outcome(engine, orphans[1:], StampState.FAILED))
    assert states(engine) == {orphans[0]: StampState.SIGNED, orphans[1]: StampState.FAILED,
                              3: StampState.PENDING}
    assert committer._hashes(1) == ([f"{8:040x}"], [f"sha512 {'8' * 128}"])
    rebuilt_identically(engine, repo, tmp_path / "other", inproc_dispatcher, clock)


def test_stamps_the_transparency_log_marked_orphaned_are_published(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
) -> None:
    """The transparency log's sequencer publishes an orphaned stamp first (within a minute,
    the git log within the hour) and marks it ``orphaned``: the next log commit publishes it
    all the same."""
    clock = Clock()
    committer = make_committer(engine, repo, inproc_dispatcher, clock)

    async def scenario() -> tuple[list[int], str | None]:
        ids = await record(engine, [DigestRequest("sha256", "7" * 64)], T0, StampState.PENDING)
        with engine.begin() as conn:  # (what server.tlog.sequencer does to it)
            conn.execute(update(Stamp).where(Stamp.id.in_(ids))
                         .values(state=StampState.ORPHANED, tlog_index=0))
        clock.advance(1)  # (young: were it pending, it would wait)
        return ids, await committer.commit_now()

    ids, head = asyncio.run(scenario())
    assert head is not None
    assert logged(repo, head) == (b"", f"sha256 {'7' * 64}\n".encode())
    assert states(engine) == dict.fromkeys(ids, StampState.ORPHANED)


def test_outcomes_due_any_moment_are_waited_for(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outcomes are recorded a little after the answer (with the next journal write): a log
    commit that finds young pending stamps first waits that long, so that stamps answered
    before it began are in it."""
    clock = Clock()
    committer = make_committer(engine, repo, inproc_dispatcher, clock, settle=1.0)
    waits: list[float] = []

    async def scenario() -> str | None:
        ids = await record(engine, [tag(0xA)], T0, StampState.PENDING)
        await record(engine, [tag(0xB)], T0)

        async def sleep(seconds: float) -> None:  # the outcome lands while it waits
            waits.append(seconds)
            await late_outcome(engine, ids, StampState.SIGNED)

        monkeypatch.setattr(committer, "_wait_for_outcomes", lambda: sleep(committer.config.settle))
        return await committer.commit_now()

    head = asyncio.run(scenario())
    assert waits == [1.0]
    assert head is not None
    assert logged(repo, head) == (f"{0xA:040x}\n{0xB:040x}\n".encode(), None)


def test_failed_stamps_assigned_by_an_older_version_stay_published(
    engine: Engine, repo: LogRepository, inproc_dispatcher: InProcessDispatcher,
) -> None:
    """Before failed stamps were left out, they were assigned and published like any other:
    a log commit assigned then (a pending row after a crash, or a committed one rebuilt on
    another host) keeps showing them, so its tree is what it was."""
    clock = Clock()
    committer = make_committer(engine, repo, inproc_dispatcher, clock)
    asyncio.run(record(engine, [tag(0xC)], T0, StampState.FAILED))
    with engine.begin() as conn:
        conn.execute(insert(LogCommit).values(id=1, created_at=T0, hash_count=0,
                                              state=LogCommitState.PENDING))
        conn.execute(update(Stamp).values(log_commit_id=1))
    head = asyncio.run(committer.commit_now())
    assert head is not None
    assert logged(repo, head) == (f"{0xC:040x}\n".encode(), None)
    assert log_rows(engine) == [(1, LogCommitState.COMMITTED, head, 1)]
