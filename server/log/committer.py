"""Periodic log commits: the period's stamped hashes become a signed commit of the public log.

Exactly one process writes a log: the one running ``stampd serve``, or, with several API hosts
on one PostgreSQL, the holder of the log lock (`server.log.leader`). The database drives it:

Git object ids go to ``hashes.log`` (Zeitgitter's format); digest stamps go to ``digests.log``
(``<algorithm> <hex>`` per line, sorted, unique; only present when the period has digests).

1. In one transaction, a `LogCommit` row is created (state ``pending``) and every stamp not yet
   logged is assigned to it.
2. The tree (``hashes.log``, ``pubkey.asc``) is written, a worker signs the commit object, and
   ``main`` advances to it.
3. The row becomes ``committed`` with the git commit id.

A crash between 1 and 3 leaves a pending row; on the next run its stamps are committed under the
same number (or, if the git commit was already written, the row is only marked). Stamps recorded
during an unfinished period are simply not assigned yet, so they reach the next commit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable

from sqlalchemy import Engine, func, insert, select, update

from server.dispatch import Dispatcher
from server.errors import StampError
from server.log.repository import LogRepository
from server.models import LogCommit, LogCommitState, Stamp
from workers.formats.jobs import CommitJob

log = logging.getLogger(__name__)

SIGN_TIMEOUT = 120.0


def log_message(number: int, count: int, t: int) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    return f"stampd log commit {number}\n\n{count} hashes stamped until {when}\n"


class LogCommitter:
    def __init__(
        self,
        engine: Engine,
        repo: LogRepository,
        dispatcher: Dispatcher,
        pubkey: str,
        interval: float,
        clock: Callable[[], float] = time.time,
        on_commit: Callable[[str], None] | None = None,
        peer_keys: Callable[[], dict[str, str]] | None = None,
        key_files: dict[str, str] | None = None,
        leader: Callable[[], bool] | None = None,
    ) -> None:
        self.engine = engine
        self.repo = repo
        self.dispatcher = dispatcher
        self.pubkey = pubkey
        self.interval = interval
        self.clock = clock
        self.on_commit = on_commit  # called in a thread with each new head
        self.peer_keys = peer_keys or dict
        self.key_files = key_files or {}  # the server's further public keys, by log path
        # Several API hosts: only the holder of the log lock commits (see server.log.leader).
        self.leader = leader
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.started_at = clock()
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
            await asyncio.sleep(self.interval)
            try:
                await self.commit_now()
                self.last_ok_at = self.clock()
                self.last_error = None
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("log commit failed; retrying at the next interval")

    async def commit_now(self) -> str | None:
        """Commit pending and newly stamped hashes; return the new head (None if nothing)."""
        async with self._lock:
            if self.leader is not None:
                if not await asyncio.to_thread(self.leader):
                    return None  # another host writes the log
                await asyncio.to_thread(self.sync_from_db)
            head = None
            for lc_id in await asyncio.to_thread(self._pending_ids):
                head = await self._finish(lc_id)
            new_id = await asyncio.to_thread(self._assign)
            if new_id is not None:
                head = await self._finish(new_id)
            return head

    # -- database steps (run in a thread) -------------------------------------------------
    def _pending_ids(self) -> list[int]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(LogCommit.id).where(LogCommit.state == LogCommitState.PENDING)
                .order_by(LogCommit.id)
            )
            return [r[0] for r in rows]

    def _assign(self) -> int | None:
        with self.engine.begin() as conn:
            last = conn.execute(
                select(func.max(Stamp.id)).where(Stamp.log_commit_id.is_(None))
            ).scalar()
            if last is None:
                return None
            lc_id = conn.execute(
                insert(LogCommit).values(created_at=int(self.clock()),
                                         state=LogCommitState.PENDING, hash_count=0)
                .returning(LogCommit.id)
            ).scalar_one()
            conn.execute(
                update(Stamp).where(Stamp.log_commit_id.is_(None), Stamp.id <= last)
                .values(log_commit_id=lc_id)
            )
            return int(lc_id)

    def _hashes(self, lc_id: int) -> tuple[list[str], list[str]]:
        """(git object ids, "<algorithm> <digest>" lines) of a log commit's stamps."""
        commits: list[str] = []
        digests: list[str] = []
        with self.engine.connect() as conn:
            rows = conn.execute(select(Stamp.kind, Stamp.commit, Stamp.algorithm, Stamp.digest)
                                .where(Stamp.log_commit_id == lc_id))
            for kind, commit, algorithm, digest in rows:
                if kind == "digest":
                    digests.append(f"{algorithm} {digest}")
                elif commit is not None:
                    commits.append(commit)
        return commits, digests

    def _mark(self, lc_id: int, git_commit: str, count: int, raw: str | None = None,
              files: dict[str, str] | None = None) -> None:
        values: dict[str, object] = {"state": LogCommitState.COMMITTED,
                                     "git_commit": git_commit, "hash_count": count}
        if raw is not None:
            values.update(raw=raw, files=json.dumps(files or {}))
        with self.engine.begin() as conn:
            conn.execute(update(LogCommit).where(LogCommit.id == lc_id).values(**values))

    def sync_from_db(self) -> int:
        """Bring the local repository up to the log recorded in the database (the log writer
        may have moved here from another host): rebuild every recorded commit that is missing,
        check it has the recorded id, and point main at the newest. Returns commits added."""
        with self.engine.connect() as conn:
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
            pubkey = files.pop("pubkey.asc", self.pubkey)
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
        t = int(self.clock())
        peer_keys = await asyncio.to_thread(self.peer_keys)
        tree = await asyncio.to_thread(self.repo.tree, hashes, self.pubkey, digests, peer_keys,
                                       self.key_files)
        files = {"pubkey.asc": self.pubkey, **self.key_files,
                 **{f"peers/{n}.asc": k for n, k in peer_keys.items()}}
        try:
            async with asyncio.timeout(SIGN_TIMEOUT):
                signed = await self.dispatcher.sign(CommitJob(
                    tree, (head,) if head else (), t, log_message(lc_id, count, t)))
        except TimeoutError:
            raise RuntimeError(f"no worker signed log commit {lc_id} in time") from None
        except StampError as e:
            raise RuntimeError(f"could not sign log commit {lc_id}: {e.message}") from e
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
        return self.clock() - last > 2 * self.interval + 30

    async def _announce(self, head: str) -> None:
        self.last_commit_at = self.clock()
        if self.on_commit is not None:
            try:
                await asyncio.to_thread(self.on_commit, head)
            except Exception:
                log.exception("could not schedule cross-stamps for %s", head)
