"""The cross-stamper in-process, with an injected clock: backoff, staleness and supersession
follow the clock, so nothing sleeps and nothing is timed.

Our log is written by the real `LogCommitter` (signed by the real `OpenPgpSigner` over a real
gpg-agent, through `InProcessDispatcher`, see conftest.py), whose ``on_commit`` is the stamper's
``head_committed``, as in `server.api.app`. The stamper's steps (``_due``, ``_attempt``) are
called directly instead of running its loop. A peer that is down is a free port nobody listens
on; a peer that is up is a real stampd subprocess (the ``other_server`` fixture, stopped by PID
by that fixture). The subprocess version of these checks is tests/system/test_peers.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pygit2
import pytest
from sqlalchemy import select

from server import db
from server.gitlog.committer import CommitterConfig, LogCommitter
from server.gitlog.peers import CrossStamper
from server.gitlog.repository import LogRepository
from server.models import CrossStamp, CrossStampState, Peer
from server.settings import Settings
from server.stamping.journal import Journal
from server.stamping.requests import TagRequest
from tests.helpers import (
    TEST_FPR,
    TEST_PUBLIC_KEY,
    InProcessDispatcher,
    Server,
    free_port,
    keyring,
    migrated_sqlite,
)

T0 = 1_795_400_000  # after the test key was made; used where no peer is involved
PUBKEY = TEST_PUBLIC_KEY.read_text()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = [float(t)]

    def __call__(self) -> float:
        return self.t[0]

    def set(self, t: float) -> int:
        self.t[0] = float(t)
        return int(t)


class Node:
    """Our side: settings, database, a log committer and the cross-stamper under test."""

    def __init__(self, data_dir: Path, peers: str, clock: Clock,
                 dispatcher: InProcessDispatcher) -> None:
        self.settings = Settings(data_dir=data_dir, peers=peers, peer_retry_base=10,
                                 peer_retry_max=600, peer_stale_after=7200, peer_timeout=10)
        self.engine = db.make_engine(migrated_sqlite(data_dir / "stampd.sqlite3"))
        self.clock = clock
        self.cross = CrossStamper(self.engine, self.settings, clock)
        self.cross._sync_peer_rows()  # what start() does before it starts the loop
        self.repo = LogRepository(self.settings.log_repo)
        self.committer = LogCommitter(self.engine, self.repo, dispatcher,
                                      CommitterConfig(PUBKEY, 3600, clock=clock),
                                      on_commit=self.cross.head_committed,
                                      peer_keys=self.cross.pinned_keys)
        self._stamps = 0

    async def new_head(self) -> str:
        """One more stamp, one more log commit; the committer announces the new head."""
        self._stamps += 1
        journal = Journal(self.engine)
        journal.start()
        try:
            sid = await journal.record(TagRequest(f"{self._stamps:040x}", "t"),
                                       int(self.clock()))
            journal.signed(sid, "w1", 1, None)  # the outcome, written as the journal stops
        finally:
            await journal.stop()
        head = await self.committer.commit_now()
        assert head is not None
        return head

    async def step(self) -> dict[str, tuple[int, str]]:
        """One pass of the stamper's loop, awaited: attempt every due peer once."""
        due = await asyncio.to_thread(self.cross._due)
        for name, (row_id, head) in due.items():
            await self.cross._attempt(name, row_id, head)
        return due

    def rows(self) -> list[tuple[int, str, str, int, str | None, int, int]]:
        """(id, log commit, state, attempts, last error, next attempt, created) by id."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(
                CrossStamp.id, CrossStamp.log_commit, CrossStamp.state, CrossStamp.attempts,
                CrossStamp.last_error, CrossStamp.next_attempt_at, CrossStamp.created_at,
            ).order_by(CrossStamp.id))
            return [(r.id, r.log_commit, r.state, r.attempts, r.last_error, r.next_attempt_at,
                     r.created_at) for r in rows]

    def close(self) -> None:
        asyncio.run(self.cross.stop())  # also removes the peer keyrings
        self.engine.dispose()


@pytest.fixture
def node_factory() -> Iterator[list[Node]]:
    nodes: list[Node] = []
    yield nodes
    for n in nodes:
        n.close()


def make_node(nodes: list[Node], data_dir: Path, peers: str, clock: Clock,
              dispatcher: InProcessDispatcher) -> Node:
    node = Node(data_dir, peers, clock, dispatcher)
    nodes.append(node)
    return node


def fingerprint(pubkey: Path, home: Path) -> str:
    """The primary key fingerprint of an armored key, as gpg itself reads it."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    r = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--with-colons",
                        "--show-keys", str(pubkey)], capture_output=True, text=True,
                       timeout=60, check=True)
    return next(line.split(":")[9] for line in r.stdout.splitlines() if line.startswith("fpr:"))


def fingerprint_of_text(armored: str, home: Path) -> str:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home / "key.asc"
    path.write_text(armored)
    return fingerprint(path, home)


def verify_commit(git_dir: Path, oid: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "--git-dir", str(git_dir), "verify-commit", "--raw", oid],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "GNUPGHOME": str(home)})


# ---------------------------------------------------------------------------------------------
# A peer that is down


def test_peer_down_backs_off_goes_stale_and_is_superseded(
    tmp_path: Path, node_factory: list[Node], inproc_dispatcher: InProcessDispatcher,
) -> None:
    clock = Clock(T0)
    port = free_port()  # bound and released: nobody listens there
    node = make_node(node_factory, tmp_path / "data", f"bee=http://127.0.0.1:{port}/", clock,
                     inproc_dispatcher)
    first = asyncio.run(node.new_head())
    [(row, head, state, attempts, _, next_at, created)] = node.rows()
    assert (head, state, attempts, next_at, created) == (first, CrossStampState.PENDING, 0, 0, T0)

    # First attempt, at T0: recorded with the base delay.
    assert asyncio.run(node.step()) == {"bee": (row, first)}
    [(_, _, state, attempts, error, next_at, _)] = node.rows()
    assert (state, attempts, next_at) == (CrossStampState.PENDING, 1, T0 + 10)
    assert error is not None and "cannot reach" in error and str(port) in error
    assert node.cross.failures == {"bee": 1} and node.cross.last_success == {}

    # Not due before its time, due at it; each failure doubles the delay, up to the maximum.
    now = T0
    for attempt, delay in enumerate([20, 40, 80, 160, 320, 600, 600], start=2):
        clock.set(next_at - 1)
        assert asyncio.run(node.step()) == {}
        now = clock.set(next_at)
        assert asyncio.run(node.step()) == {"bee": (row, first)}
        [(_, _, state, attempts, error, next_at, _)] = node.rows()
        assert (state, attempts) == (CrossStampState.PENDING, attempt)
        assert next_at - now == delay
    assert node.cross.failures == {"bee": 8}
    assert node.cross.peer_status()[0].failures == 8

    # Stale once the head has waited longer than peer_stale_after.
    clock.set(T0 + 7200)
    assert node.cross.stale_peers(node.settings.peer_stale_after) == {}
    clock.set(T0 + 7201)
    stale = node.cross.stale_peers(node.settings.peer_stale_after)
    assert list(stale) == ["bee"]
    assert stale["bee"].startswith(f"waiting since {T0}: cannot reach")

    # A newer head supersedes the older pending row and is due at once, despite the backoff.
    second = asyncio.run(node.new_head())
    assert asyncio.run(node.step()) == {"bee": (row + 1, second)}
    rows = node.rows()
    assert [(r[1], r[2]) for r in rows] == [(first, CrossStampState.SUPERSEDED),
                                           (second, CrossStampState.PENDING)]
    assert rows[0][3] == 8  # the superseded row keeps its history
    assert (rows[1][3], rows[1][5]) == (1, T0 + 7201 + 10)  # the new row: its own backoff
    assert node.cross.stale_peers(node.settings.peer_stale_after) == {}
    # Nothing was pinned and no branch was made.
    assert node.cross.pinned_keys() == {}
    assert node.repo.branch_head("bee-timestamps") is None


# ---------------------------------------------------------------------------------------------
# A peer that is up: a real stampd with its own key


@pytest.mark.slow
def test_peer_up_stamps_our_head_and_is_pinned(
    tmp_path: Path, node_factory: list[Node], inproc_dispatcher: InProcessDispatcher,
    other_server: Server,
) -> None:
    peer_pubkey = other_server.data_dir / "keys" / "pubkey.asc"
    peer_fpr = fingerprint(peer_pubkey, tmp_path / "show")
    assert peer_fpr != TEST_FPR  # its stamps can be told from our own signatures
    # The peer signs with its real clock, which must agree with ours within ±30 s: our clock
    # starts at the real time and is not advanced in this test.
    clock = Clock(int(time.time()))
    node = make_node(node_factory, tmp_path / "data", f"bee={other_server.url}", clock,
                     inproc_dispatcher)

    first = asyncio.run(node.new_head())
    [(row, _, _, _, _, _, _)] = node.rows()
    assert asyncio.run(node.step()) == {"bee": (row, first)}
    [(_, head, state, attempts, error, _, _)] = node.rows()
    assert (head, state, attempts, error) == (first, CrossStampState.DONE, 1, None)
    assert node.cross.failures == {"bee": 0}
    assert node.cross.last_success == {"bee": clock()}

    # The branch exists in our log and holds the peer's stamp of our head.
    stamp = node.repo.branch_head("bee-timestamps")
    assert stamp is not None
    c = node.repo.repo[stamp]
    assert isinstance(c, pygit2.Commit)
    assert [str(p) for p in c.parent_ids] == [first]
    assert c.tree_id == node.repo.repo[first].peel(pygit2.Commit).tree_id
    with node.engine.connect() as conn:
        stamp_commit, stamp_text = conn.execute(
            select(CrossStamp.stamp_commit, CrossStamp.stamp_text)).one()
    assert stamp_commit == stamp
    assert stamp_text is not None and stamp_text.encode() == node.repo.repo.odb.read(stamp)[1]

    # The real git verifies it with the peer's key, and not with ours.
    peer_home = keyring(peer_pubkey, tmp_path / "gpeer")
    r = verify_commit(node.settings.log_repo, stamp, peer_home)
    assert r.returncode == 0, r.stderr
    assert f"VALIDSIG {peer_fpr} " in r.stderr
    r = verify_commit(node.settings.log_repo, stamp, keyring(TEST_PUBLIC_KEY, tmp_path / "gown"))
    assert r.returncode != 0

    # Trust on first use: the key the peer served is pinned and published.
    with node.engine.connect() as conn:
        pin = conn.execute(select(Peer.fingerprint, Peer.pubkey, Peer.pinned_at,
                                  Peer.pinned_by).where(Peer.name == "bee")).one()
    assert (pin.fingerprint, pin.pinned_at, pin.pinned_by) == (peer_fpr, int(clock()), "tofu")
    assert pin.pubkey is not None
    assert fingerprint_of_text(pin.pubkey, tmp_path / "pinned") == peer_fpr
    assert node.cross.pinned_keys() == {"bee": pin.pubkey}

    # The next log commit carries the pinned key; its stamp chains onto the first stamp.
    second = asyncio.run(node.new_head())
    published = node.repo.repo[second].peel(pygit2.Commit).tree["peers/bee.asc"]
    assert isinstance(published, pygit2.Blob) and published.data == pin.pubkey.encode()
    assert asyncio.run(node.step()) == {"bee": (row + 1, second)}
    assert [r[2] for r in node.rows()] == [CrossStampState.DONE, CrossStampState.DONE]
    again = node.repo.branch_head("bee-timestamps")
    assert again is not None
    assert [str(p) for p in node.repo.repo[again].peel(pygit2.Commit).parent_ids] == [
        stamp, second]
    r = verify_commit(node.settings.log_repo, again, peer_home)
    assert r.returncode == 0 and f"VALIDSIG {peer_fpr} " in r.stderr, r.stderr


@pytest.mark.slow
def test_peer_serving_another_key_than_the_configured_pin_is_refused(
    tmp_path: Path, node_factory: list[Node], inproc_dispatcher: InProcessDispatcher,
    other_server: Server,
) -> None:
    clock = Clock(int(time.time()))
    node = make_node(node_factory, tmp_path / "data", f"bee={other_server.url}#{TEST_FPR}",
                     clock, inproc_dispatcher)
    first = asyncio.run(node.new_head())
    assert asyncio.run(node.step()) == {"bee": (1, first)}
    [(_, _, state, attempts, error, next_at, _)] = node.rows()
    assert (state, attempts, next_at) == (CrossStampState.PENDING, 1, int(clock()) + 10)
    assert error is not None and f"configured pin is {TEST_FPR}" in error
    assert node.cross.pinned_keys() == {}
    assert node.repo.branch_head("bee-timestamps") is None
