"""Periodic log commits: the period's stamped hashes become a signed commit of the public log.

Exactly one process writes a log: the holder of the log lock (`server.leadership`), a file lock
among the HTTP processes of one ``stampd serve``, an advisory lock among several API hosts on one
PostgreSQL. The database drives it:

Git object ids go to ``hashes.log`` (Zeitgitter's format); digest stamps go to ``digests.log``
(``<algorithm> <hex>`` per line, sorted, unique; only present when the period has digests).

1. In one transaction, a `LogCommit` row is created (state ``pending``) and every stamp whose
   outcome is settled is assigned to it (see "Which stamps" below).
2. The tree (``hashes.log``, ``pubkey.asc``) is written, a worker signs the commit object, and
   ``main`` advances to it.
3. The row becomes ``committed`` with the git commit id.

A crash between 1 and 3 leaves a pending row; on the next run its stamps are committed under the
same number (or, if the git commit was already written, the row is only marked). Stamps recorded
during an unfinished period are simply not assigned yet, so they reach the next commit.

Which stamps: the log shows exactly the stamps whose signature may have reached a client.

- ``signed`` stamps are assigned and published.
- ``failed`` stamps (the client got a 503; nothing signed left the server) are assigned, so they
  are not looked at again, and marked ``failed-unlogged`` in the same transaction: not
  published, not counted. A period of failed stamps only makes no log commit; they go along
  with the next one.
- ``pending`` stamps may still be signed or fail. A live request gets its outcome within the
  request timeout (the stamper gives up then), recorded with the journal's next write, so a
  pending stamp younger than ``request_timeout + OUTCOME_GRACE`` is left for a later log
  commit. An older one belongs to a process that died between journaling and recording the
  outcome, perhaps after its signature went out: it is assigned and published, and marked
  ``orphaned`` in the same transaction (unless the transparency log's sequencer, which
  publishes it too, marked it first). ``orphaned`` stamps are published like ``signed`` ones.

What a log commit publishes is thus fixed when its stamps are assigned: every stamp assigned to
it except those marked ``failed-unlogged`` then, whatever outcome a pending one gets later
(`_hashes`). `sync_from_db` relies on that to rebuild identical trees; and rows assigned by
older versions, which published failed stamps too, still rebuild as they were.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, Engine, Select, and_, insert, or_, select, update

from formats.jobs import CommitJob
from formats.manifests import ALGORITHMS, unpack
from server import db
from server.db import reading
from server.dispatch import Dispatcher, NotSigned, sign_own
from server.gitlog.repository import LogRepository
from server.models import LogCommit, LogCommitState, ManifestDigests, Stamp, StampState
from server.settings import Settings

log = logging.getLogger(__name__)

SIGN_TIMEOUT = 120.0
# Seconds past the request timeout after which a pending stamp is taken for orphaned (its
# process died). They cover what lies between a stamp's time and its outcome besides the
# signing itself: the journal commit before signing, the journal's wait before it writes an
# outcome (UPDATE_DELAY, 0.5 s) and that write, and stamp times in whole seconds.
OUTCOME_GRACE = 10.0
# The longest request timeout the settings allow: the default, so that a committer not told
# the timeout never takes a live stamp for orphaned.
MAX_REQUEST_TIMEOUT = 25.0
# Seconds a log commit waits when it finds young pending stamps, for outcomes already known
# but not yet written (the journal writes them within UPDATE_DELAY): stamps answered before
# the log commit began are then in it rather than in the next one.
SETTLE = 1.0


def _locked(where: ColumnElement[bool]) -> Select[int]:
    """The ids of the stamps matching ``where``, locked in id order (``FOR UPDATE``)."""
    return select(Stamp.id).where(where).order_by(Stamp.id).with_for_update()


def log_message(number: int, count: int, t: int) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    return f"stampd log commit {number}\n\n{count} hashes stamped until {when}\n"


@dataclass(frozen=True)
class CommitterConfig:
    """The plain values a `LogCommitter` runs by, apart from the parts it works with: fixed
    for its life, built from the settings in one place (`of`) or by a test with just what it
    needs."""

    pubkey: str  # the primary key's public key, the log's pubkey.asc
    interval: float  # seconds between log commits
    # The server's further public keys, by log path.
    key_files: Mapping[str, str] = field(default_factory=dict)
    # The HTTP processes of one host share the repository: a new writer finds every commit in
    # place and has nothing to rebuild from the database.
    shared_repo: bool = False
    # The stamper's STAMPD_REQUEST_TIMEOUT: no live request stays pending longer.
    request_timeout: float = MAX_REQUEST_TIMEOUT
    settle: float = SETTLE
    clock: Callable[[], float] = time.time

    @classmethod
    def of(cls, settings: Settings, pubkey: str, key_files: Mapping[str, str],
           clock: Callable[[], float]) -> CommitterConfig:
        """The configuration of the server's log: ``pubkey`` and ``key_files`` are the served
        keys' public halves (the keys are the registry's, not the settings')."""
        return cls(pubkey, settings.commit_interval, key_files,
                   shared_repo=settings.dispatch == "socket",
                   request_timeout=settings.request_timeout, clock=clock)


class LogCommitter:
    """The log's writer loop (see the module docstring). ``leader`` says whether this process
    writes the log (None: it always does); ``on_commit`` is called in a thread with each new
    head; ``peer_keys`` and ``extra_files`` are read at each commit: the pinned keys of the
    peers, and further files by log path (the transparency log's checkpoint)."""

    def __init__(
        self,
        engine: Engine,
        repo: LogRepository,
        dispatcher: Dispatcher,
        config: CommitterConfig,
        *,
        leader: Callable[[], bool] | None = None,
        on_commit: Callable[[str], None] | None = None,
        peer_keys: Callable[[], dict[str, str]] | None = None,
        extra_files: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        self.engine = engine
        # Its reads take no lock on SQLite: reading a period's stamps must not hold up the
        # journal's writes (see server.db.reading).
        self.reader = reading(engine)
        self.repo = repo
        self.dispatcher = dispatcher
        self.config = config
        # Several API hosts: only the holder of the log lock commits (see server.leadership).
        self.leader = leader
        self.on_commit = on_commit
        self.peer_keys = peer_keys or dict
        self.extra_files = extra_files or dict
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.started_at = config.clock()
        self.last_commit_at: float | None = None  # time of the newest log commit
        self.last_ok_at: float | None = None  # last run that committed or had nothing to do
        self.last_error: str | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="log-committer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval)
            try:
                await self.commit_now()
                self.last_ok_at = self.config.clock()
                self.last_error = None
            except NotSigned as e:  # (expected while no worker can sign: one line)
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("%s; retrying at the next interval", e)
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("log commit failed; retrying at the next interval")

    async def commit_now(self) -> str | None:
        """Commit pending and newly stamped hashes; return the new head (None if nothing)."""
        async with self._lock:
            if self.leader is not None:
                if not await asyncio.to_thread(self.leader):
                    return None  # another process writes the log
                if not self.config.shared_repo:
                    await asyncio.to_thread(self.sync_from_db)
            head = None
            for lc_id in await asyncio.to_thread(self._pending_ids):
                head = await self._finish(lc_id)
            if self.config.settle > 0 and await asyncio.to_thread(self._outcomes_due):
                await self._wait_for_outcomes()
            new_id = await asyncio.to_thread(self._assign)
            if new_id is not None:
                head = await self._finish(new_id)
            return head

    async def _wait_for_outcomes(self) -> None:
        await asyncio.sleep(self.config.settle)

    # -- database steps (run in a thread) -------------------------------------------------
    def _pending_ids(self) -> list[int]:
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(LogCommit.id).where(LogCommit.state == LogCommitState.PENDING)
                .order_by(LogCommit.id)
            )
            return [r[0] for r in rows]

    def _orphan_cutoff(self) -> int:
        """Pending stamps with a time before this second have no live request behind them."""
        # stamped_at is whole seconds: stamped_at < now - t  <=>  stamped_at < ceil(now - t)
        return math.ceil(self.config.clock() - self.config.request_timeout - OUTCOME_GRACE)

    def _outcomes_due(self) -> bool:
        """Are there unassigned stamps whose outcome may still be recorded?"""
        with self.reader.connect() as conn:
            return conn.execute(
                select(Stamp.id).where(Stamp.log_commit_id.is_(None),
                                       Stamp.state == StampState.PENDING,
                                       Stamp.stamped_at >= self._orphan_cutoff()).limit(1)
            ).first() is not None

    def _assign(self) -> int | None:
        return db.retry_transient(self._assign_once, what="assign stamps to a log commit")

    def _assign_once(self) -> int | None:
        orphaned: ColumnElement[bool] = and_(Stamp.state == StampState.PENDING,
                                             Stamp.stamped_at < self._orphan_cutoff())
        published: ColumnElement[bool] = and_(
            Stamp.log_commit_id.is_(None),
            or_(Stamp.state.in_((StampState.SIGNED, StampState.ORPHANED)), orphaned))
        with self.engine.connect() as conn, conn.begin() as tx:
            # Nothing to publish, no log commit (and no number used up): failed stamps alone
            # wait for the next one.
            if conn.execute(select(Stamp.id).where(published).limit(1)).first() is None:
                return None
            lc_id = conn.execute(
                insert(LogCommit).values(created_at=int(self.config.clock()),
                                         state=LogCommitState.PENDING, hash_count=0)
                .returning(LogCommit.id)
            ).scalar_one()
            # Rows are locked in id order, as the journal's batch updates lock them, so that
            # two writers can never wait on each other (PostgreSQL; SQLite has one writer).
            if not conn.execute(update(Stamp).where(Stamp.id.in_(_locked(published)))
                                .values(log_commit_id=lc_id)).rowcount:
                tx.rollback()  # what was there turned failed meanwhile
                return None
            # Pending stamps published without an outcome say so (the transparency log's
            # sequencer may have marked them already).
            conn.execute(update(Stamp).where(Stamp.log_commit_id == lc_id, orphaned)
                         .values(state=StampState.ORPHANED))
            # Failed stamps go along unpublished, marked so in the same transaction: what the
            # log commit shows is fixed now (see the module docstring).
            failed = and_(Stamp.log_commit_id.is_(None), Stamp.state == StampState.FAILED)
            conn.execute(update(Stamp).where(Stamp.id.in_(_locked(failed)))
                         .values(log_commit_id=lc_id, state=StampState.FAILED_UNLOGGED))
            return int(lc_id)

    def _hashes(self, lc_id: int) -> tuple[list[str], list[str]]:
        """(git object ids, "<algorithm> <digest>" lines) that a log commit publishes: its
        stamps but those that had failed when they were assigned."""
        commits: list[str] = []
        digests: list[str] = []
        with self.reader.connect() as conn:
            rows = conn.execute(select(Stamp.kind, Stamp.commit, Stamp.algorithm, Stamp.digest)
                                .where(Stamp.log_commit_id == lc_id,
                                       Stamp.state != StampState.FAILED_UNLOGGED))
            manifests = False
            for kind, commit, algorithm, digest in rows:
                if kind in ("digest", "tsa"):  # RFC 3161 imprints are logged as digests
                    digests.append(f"{algorithm} {digest}")
                elif kind == "manifest":
                    manifests = True
                elif commit is not None:
                    commits.append(commit)
            if manifests:  # their digests (never their names)
                for algorithm, packed in conn.execute(
                    select(ManifestDigests.algorithm, ManifestDigests.digests)
                    .join(Stamp, Stamp.id == ManifestDigests.stamp_id)
                    .where(Stamp.log_commit_id == lc_id, Stamp.kind == "manifest",
                           Stamp.state != StampState.FAILED_UNLOGGED)):
                    prefix = f"{algorithm} "
                    digests += [prefix + d for d in unpack(packed, ALGORITHMS[algorithm] // 2)]
        return commits, digests

    def _mark(self, lc_id: int, git_commit: str, count: int, raw: str | None = None,
              files: dict[str, str] | None = None) -> None:
        values: dict[str, object] = {"state": LogCommitState.COMMITTED,
                                     "git_commit": git_commit, "hash_count": count}
        if raw is not None:
            values.update(raw=raw, files=json.dumps(files or {}))
        db.run_transaction(
            self.engine,
            lambda conn: conn.execute(update(LogCommit).where(LogCommit.id == lc_id)
                                      .values(**values)),
            what="mark a log commit", idempotent=True)

    def sync_from_db(self) -> int:
        """Bring the local repository up to the log recorded in the database (the log writer
        may have moved here from another host): rebuild every recorded commit that is missing,
        check it has the recorded id, and point main at the newest. Returns commits added."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(LogCommit.id, LogCommit.git_commit, LogCommit.raw, LogCommit.files)
                .where(LogCommit.state == LogCommitState.COMMITTED,
                       LogCommit.raw.is_not(None), LogCommit.git_commit.is_not(None))
                .order_by(LogCommit.id)).all()
        added = 0
        for lc_id, git_commit, raw, files_json in rows:
            assert git_commit is not None and raw is not None
            if self.repo.has(git_commit):
                continue
            hashes, digests = self._hashes(lc_id)
            files = json.loads(files_json or "{}")
            pubkey = files.pop("pubkey.asc", self.config.pubkey)
            peers = {p[len("peers/"):-len(".asc")]: c for p, c in files.items()
                     if p.startswith("peers/")}
            others = {p: c for p, c in files.items() if not p.startswith("peers/")}
            self.repo.tree(hashes, pubkey, digests, peers, others)
            oid = self.repo.write_raw_commit(raw.encode("ascii"))
            if oid != git_commit:
                raise RuntimeError(f"log commit {lc_id} rebuilt as {oid}, recorded {git_commit}")
            added += 1
        newest = rows[-1][1] if rows else None
        if newest is not None and self.repo.head() != newest:
            self.repo.force_main(newest)
        if added:
            log.info("rebuilt %d log commits recorded by another host", added)
        return added

    # -- one commit --------------------------------------------------------------------------
    async def _finish(self, lc_id: int) -> str:
        hashes, digests = await asyncio.to_thread(self._hashes, lc_id)
        count = len(set(hashes)) + len(set(digests))
        head = self.repo.head()
        if head is not None and self.repo.message(head).startswith(
            f"stampd log commit {lc_id}\n"
        ):
            await asyncio.to_thread(self._mark, lc_id, head, count)  # written before a crash
            await self._announce(head)
            return head
        t = int(self.config.clock())
        peer_keys = await asyncio.to_thread(self.peer_keys)
        others = {**self.config.key_files, **await asyncio.to_thread(self.extra_files)}
        pubkey = self.config.pubkey
        tree = await asyncio.to_thread(self.repo.tree, hashes, pubkey, digests, peer_keys, others)
        files = {"pubkey.asc": pubkey, **others,
                 **{f"peers/{n}.asc": k for n, k in peer_keys.items()}}
        signed = await sign_own(
            self.dispatcher, CommitJob(tree, (head,) if head else (), t,
                                       log_message(lc_id, count, t)),
            within=SIGN_TIMEOUT, what=f"log commit {lc_id}")
        commit_id = await asyncio.to_thread(
            self.repo.store_commit, signed.text.encode("ascii"), head
        )
        await asyncio.to_thread(self._mark, lc_id, commit_id, count, signed.text, files)
        log.info("log commit %d: %s with %d hashes", lc_id, commit_id, count)
        await self._announce(commit_id)
        return commit_id

    def overdue(self) -> bool:
        """No successful log run for more than two intervals (plus slack)."""
        last = self.last_ok_at or self.started_at
        return self.config.clock() - last > 2 * self.config.interval + 30

    async def _announce(self, head: str) -> None:
        self.last_commit_at = self.config.clock()
        if self.on_commit is not None:
            try:
                await asyncio.to_thread(self.on_commit, head)
            except Exception:
                log.exception("could not schedule cross-stamps for %s", head)
