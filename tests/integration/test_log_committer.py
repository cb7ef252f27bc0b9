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
from sqlalchemy import Engine, select, update

from server import db
from server.log.committer import LogCommitter
from server.log.repository import LogRepository
from server.models import LogCommit, LogCommitState, Stamp
from server.stamping.journal import Journal
from server.stamping.requests import BranchRequest, DigestRequest, Request, TagRequest
from tests.helpers import TEST_FPR, TEST_PUBLIC_KEY, TEST_UID, InProcessDispatcher, keyring
from workers.formats.jobs import CommitJob

# The injected clock starts here: after the test key was made (gpg refuses signatures older
# than their key), and fixed, so that commit times and messages are known exactly.
T0 = 1_795_400_000  # 2026-11-23 02:13:20 UTC
PUBKEY = TEST_PUBLIC_KEY.read_text()
TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


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
    eng = db.make_engine(f"sqlite:///{tmp_path / 'stampd.sqlite3'}")
    db.upgrade(eng)
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
                   key_files: dict[str, str] | None = None) -> LogCommitter:
    return LogCommitter(engine, repo, dispatcher, pubkey, interval, clock,
                        on_commit=None if heads is None else heads.append,
                        peer_keys=peer_keys, key_files=key_files)


async def record(engine: Engine, reqs: list[Request], t: int) -> list[int]:
    """Journal the requests (as the stamping path does before signing); their stamp ids."""
    journal = Journal(engine)
    journal.start()
    try:
        return list(await asyncio.gather(*(journal.record(r, t) for r in reqs)))
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

    async def one_pass() -> None:
        loop_committer.start()
        try:
            async with asyncio.timeout(60):  # a guard against a hang, not a measurement
                while loop_committer.last_ok_at is None:
                    await asyncio.sleep(0)
        finally:
            await loop_committer.stop()

    asyncio.run(one_pass())
    assert loop_committer.last_ok_at == clock()
    assert loop_committer.last_error is None
    assert not loop_committer.overdue()
    clock.advance(31)
    assert loop_committer.overdue()
    assert repo.head() is None  # nothing was stamped, so nothing was committed


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
