"""The transparency log's writer: sequencing stamps into entries, tiles, signed checkpoints.

Every ``interval`` seconds, in the one HTTP process of a host that holds the host's tlog lock
(``run/tlog.lock``, or the log lock itself where the host's processes share one log):

1. its tiles catch up with the database's entries (after a restart, or on a host that does
   not sequence);
2. if it is the sequencer (the only one among hosts sharing a PostgreSQL database: an
   advisory lock of its own), the stamps not yet in the log are sequenced, in journal (id)
   order, in one transaction that writes their entries (`server.models.TlogEntry`) and their
   ``tlog_index`` (on SQLite made from the stamps read before it, and, where this process
   has the journal, the journal's group commits: `Tlog._sequence`), and their tiles are
   written;
3. the sequencer has the tree's new head signed by the log key (a `formats.jobs.NoteJob` for
   a worker: the key stays in its agent), stores the checkpoint in the database and publishes
   it; another host publishes the database's checkpoint once its own tiles reach its size, and
   again whenever the database's note of that size changed (cosignatures were added);
4. the sequencer hands the newest checkpoint to its witnesses' sender
   (`server.tlog.witness_client`), which runs in tasks of its own; the cosignatures it collects
   come back through `Tlog.add_cosignatures`, which republishes the checkpoint with them if it
   is still the newest.

Which stamps: those the public git log lists (`server.gitlog.committer`): signed ones, and
pending ones older than the request timeout plus `OUTCOME_GRACE` (their process died; their
signature may have gone out). Failed stamps never get an entry. The database fixes the tree:
an entry, once committed, never changes, and the tiles are made from the entries, so after
any crash the log goes on with the same tree.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from formats.jobs import NoteJob
from formats.keys import TLOG_KEY, ServedKey
from formats.note import (
    Ed25519Verifier,
    Signature,
    VerifierKey,
    ed25519_signer,
    parse_note,
    sign_note,
)
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import encode_entry
from server import db
from server.db import reading
from server.dispatch import Dispatcher, NotSigned, sign_own
from server.gitlog.committer import MAX_REQUEST_TIMEOUT, OUTCOME_GRACE
from server.models import ManifestText, Stamp, StampState, TlogCheckpoint, TlogEntry
from server.settings import Settings
from server.tlog.store import TilesMismatch, TileWriter, checkpoint_size
from server.tlog.witness_client import Offered, WitnessSender, merge_cosignatures

log = logging.getLogger(__name__)

INTERVAL = 0.5  # seconds between steps: a stamp's proof waits about this long for its step
BATCH = 20_000  # stamps sequenced in one transaction (a step runs several while there are more)
WRITE_ROWS = 100  # stamps sequenced by one set of statements (`_Batch.writes`)
CATCH_UP = 20_000  # entries read at a time when the tiles catch up with the database
SIGN_TIMEOUT = 30.0
TLOG_LOCK = 0x746C6F67  # "tlog": the sequencer's advisory lock among hosts on PostgreSQL


class _Changed(Exception):
    """A batch's writes were not kept (`Tlog._write_apart`)."""


@dataclass(frozen=True)
class _Batch:
    """Stamps to sequence: their ids and states as read, and their entries, the log's
    ``first``, ``first + 1``, ..."""

    first: int
    ids: list[int]
    states: list[str]
    entries: list[bytes]

    def writes(self, p: str) -> list[db.Writes]:
        """The entries and the stamps' indexes, `WRITE_ROWS` stamps a set of two statements
        (parameter marker ``p``): an entry is inserted only while the log has exactly the
        entries before it, a stamp's index set only while its state is the one read and it
        has none, so that a set changes ``2 * n`` rows, its ``n`` stamps', exactly when the
        log and they are still as read (`server.db.Writes`); a set whose predecessor was not
        kept is not kept either."""
        sets: list[db.Writes] = []
        for i in range(0, len(self.ids), WRITE_ROWS):
            n = min(WRITE_ROWS, len(self.ids) - i)
            insert = (
                f"INSERT INTO tlog_entries (idx, entry) SELECT v.column1, v.column2 FROM "
                f"(VALUES {', '.join([f'({p}, {p})'] * n)}) AS v WHERE (SELECT COALESCE("
                f"MAX(idx) + 1, 0) FROM tlog_entries) = {p}",
                (*(v for j in range(i, i + n) for v in (self.first + j, self.entries[j])),
                 self.first + i))
            # A pending stamp published without an outcome (its process died) says so.
            index = (
                f"UPDATE stamps SET tlog_index = v.column1, state = CASE WHEN stamps.state = "
                f"'{StampState.PENDING}' THEN '{StampState.ORPHANED}' ELSE stamps.state END "
                f"FROM (VALUES {', '.join([f'({p}, {p}, {p})'] * n)}) AS v WHERE stamps.id = "
                "v.column2 AND stamps.state = v.column3 AND stamps.tlog_index IS NULL",
                tuple(v for j in range(i, i + n)
                      for v in (self.first + j, self.ids[j], self.states[j])))
            sets.append(db.Writes((insert, index), 2 * n))
        return sets


class OriginMismatch(Exception):
    """This host's log origin is not the one of the log's stored checkpoints."""


@dataclass(frozen=True)
class LogKey:
    """The log's public key: its note key name (the origin) and Ed25519 key."""

    vkey: str

    @property
    def verifier(self) -> VerifierKey:
        return VerifierKey.parse(self.vkey)

    @property
    def origin(self) -> str:
        return self.verifier.name


def entry_of(row: Any, fingerprints: Mapping[str | None, str],
             signed_sha256: str | None) -> bytes:
    """The log entry of a stamp row ``(id, kind, commit, object_id, algorithm, digest,
    stamped_at, key_id)``."""
    sid, kind, commit, object_id, algorithm, digest, t, key_id = row
    key = fingerprints.get(key_id) or fingerprints[None]
    if kind in ("tag", "branch"):
        return encode_entry(sid, kind, t, key, commit=commit, object_id=object_id)
    if kind == "manifest":
        return encode_entry(sid, kind, t, key, signed=signed_sha256)
    return encode_entry(sid, kind, t, key, algorithm=algorithm, digest=digest)


@dataclass(frozen=True)
class TlogConfig:
    """The plain values a `Tlog` runs by, apart from the parts it works with: fixed for its
    life, built from the settings in one place (`of`) or by a test with just what it needs."""

    root: Path  # this host's tiles and checkpoint
    key: LogKey
    # A stamp's ``key_id`` (None: the primary key) → its key's fingerprint, for its entry.
    fingerprints: Mapping[str | None, str]
    key_id: str = TLOG_KEY.id  # the key the workers sign checkpoints with
    interval: float = INTERVAL
    # The stamper's STAMPD_REQUEST_TIMEOUT: a pending stamp older than it (and OUTCOME_GRACE)
    # is taken for orphaned and sequenced.
    request_timeout: float = MAX_REQUEST_TIMEOUT
    # Several hosts (database dispatch): the checkpoint goes through the database to the
    # hosts that do not sequence. One host keeps it in its file only (a commit less).
    shared: bool = False
    clock: Callable[[], float] = time.time

    @classmethod
    def of(cls, settings: Settings, key: LogKey, served: Sequence[ServedKey],
           clock: Callable[[], float]) -> TlogConfig:
        """The configuration of the server's log: ``key`` is the log's public key, ``served``
        the keys whose stamps it lists."""
        return cls(settings.data_dir / "tlog", key, fingerprints_of(served),
                   request_timeout=settings.request_timeout,
                   shared=settings.dispatch == "database", clock=clock)


class Tlog:
    """The transparency log's writer loop (see the module docstring). ``host_lock`` says
    whether this process writes the tiles of its host; ``sequencer`` (called only while it
    does) whether it also sequences and signs; ``on_stop`` closes those locks' own
    connections."""

    def __init__(
        self,
        engine: Engine,
        dispatcher: Dispatcher,
        config: TlogConfig,
        host_lock: Callable[[], bool],
        sequencer: Callable[[], bool],
        *,
        on_stop: Sequence[Callable[[], None]] = (),
        witnesses: Callable[[Tlog], WitnessSender] | None = None,
        on_published: Callable[[int], None] | None = None,
        write_along: Callable[[db.Writes], asyncio.Future[bool]] | None = None,
    ) -> None:
        self.engine = engine
        self.dispatcher = dispatcher
        self.config = config
        self.host_lock = host_lock
        self.sequencer = sequencer
        self.on_stop = on_stop
        # The journal's, where this process has it (SQLite): the sequenced entries go into
        # its group commits, 100 stamps a commit (`server.stamping.journal.Journal.write_along`).
        self.write_along = write_along
        self.reader = reading(engine)
        self.writer = TileWriter(config.root)
        self._opened = False
        self._origin_checked = False  # (the sequencer's origin against the stored checkpoint)
        self._published: int | None = None  # size of the checkpoint this host publishes
        # Told of each new size published (on the event loop): the host's proof waiters.
        self.on_published = on_published
        self._told: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.last_error: str | None = None
        self.last_checkpoint_at: float | None = None
        self.sequenced = 0  # entries this process sequenced (metrics)
        # The tiles hold every entry of the database: this process sequenced the last ones in
        # the step before, which went well (the next one need not catch up; had another one
        # sequenced since, the sequencing would find out and fail, and the next catch up).
        self._current = False
        self._note: bytes | None = None  # the checkpoint note this host publishes
        # (The checkpoint file is written by the sequencing step and by the witnesses'
        # cosignatures coming in: one at a time, so that only the newest is published.)
        self._publish_lock = asyncio.Lock()
        self.witnesses = None if witnesses is None else witnesses(self)

    # -- running ----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tlog")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.witnesses is not None:
            await self.witnesses.stop()
        for close in self.on_stop:
            close()

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
                self.last_error = None
            except NotSigned as e:  # (expected while no worker can sign: one line)
                if self.last_error != f"{type(e).__name__}: {e}":
                    log.warning("transparency log: %s; retrying", e)
                self.last_error = f"{type(e).__name__}: {e}"
            except Exception as e:
                if self.last_error != f"{type(e).__name__}: {e}":
                    log.exception("transparency log step failed; retrying")
                self.last_error = f"{type(e).__name__}: {e}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.interval)
            self._wake.clear()

    async def step(self) -> int | None:
        """One round (see the module docstring); the size published after it (None when this
        process does not write its host's tiles)."""
        current, self._current = self._current, False
        if not await asyncio.to_thread(self.host_lock):
            return None
        if not self._opened:
            await asyncio.to_thread(self._open)
        if not current:
            await asyncio.to_thread(self._catch_up)
        if await asyncio.to_thread(self.sequencer):
            if not self._origin_checked:
                await asyncio.to_thread(self._stored_checkpoint)
                self._origin_checked = True
            while await self._sequence() == BATCH:
                pass
            self._current = True
            if self._published != self.writer.size:
                await self._checkpoint()
            self._offer()
        else:
            async with self._publish_lock:  # (a sender of this process may still publish)
                await asyncio.to_thread(self._follow)
        if self._published is not None and self._published != self._told:
            self._told = self._published
            if self.on_published is not None:
                self.on_published(self._published)
        return self._published

    # -- steps (in a thread) ----------------------------------------------------------------
    def _open(self) -> None:
        try:
            self.writer.open()
        except TilesMismatch as e:
            log.warning("transparency log: %s; rebuilding the tiles from the database", e)
            self.writer.reset()
        note = self.writer.read_checkpoint()
        self._published = None if note is None else checkpoint_size(note)
        self._note = note
        if note is not None:
            self._check_origin(note)
        self._opened = True

    def _check_origin(self, note: bytes) -> None:
        """`OriginMismatch` when ``note`` (a checkpoint of this log) is of another origin than
        this host's: the hosts of one log, and one host over time, keep one origin."""
        origin, ours = Checkpoint.parse(parse_note(note).text).origin, self.config.key.origin
        if origin != ours:
            raise OriginMismatch(
                f"the log's checkpoints are of origin {origin!r}, this host's "
                f"STAMPD_TLOG_ORIGIN is {ours!r}: a log keeps one origin (every "
                "host of it too)")

    def _catch_up(self) -> None:
        """Write the tiles of the database's entries this host has not written yet."""
        while True:
            with self.reader.connect() as conn:
                rows = conn.execute(
                    select(TlogEntry.idx, TlogEntry.entry).where(TlogEntry.idx >= self.writer.size)
                    .order_by(TlogEntry.idx).limit(CATCH_UP)).all()
            if not rows:
                return
            if rows[0][0] != self.writer.size or rows[-1][0] != self.writer.size + len(rows) - 1:
                raise RuntimeError(f"the log's entries from {self.writer.size} have gaps")
            self.writer.append(self.writer.size, [bytes(r[1]) for r in rows])
            if len(rows) < CATCH_UP:
                return

    def _orphan_cutoff(self) -> int:
        return math.ceil(self.config.clock() - self.config.request_timeout - OUTCOME_GRACE)

    async def _sequence(self) -> int:
        """Sequence up to `BATCH` stamps; how many.

        On SQLite a transaction that writes holds the database's one write lock, and every
        stamp's journal commit waits for it. So the stamps are read and their entries made
        first, in a read transaction, and their writes are guarded (`_Batch.writes`: kept
        only if the log and the stamps are still as read) and go into the journal's group
        commits where this process has the journal (`write_along`), else into a transaction
        of their own. If a stamp's outcome was journalled in between (its state changed),
        the stamps from it on are read again inside the writing transaction, as on
        PostgreSQL (whose row locks hold up no journal commit) they always are."""
        kept = 0
        if self.engine.dialect.name == "sqlite":
            read = await asyncio.to_thread(self._read_apart)
            if not read.ids:
                return 0
            sets = read.writes(_param(self.engine))
            if self.write_along is not None:
                kept = await self._write_along(sets)
            elif await asyncio.to_thread(self._write_apart, sets):
                kept = len(read.ids)
            await self._append(read.first, read.entries[:kept])
            if kept == len(read.ids):
                return kept
            log.info("transparency log: stamps changed since read; reading them again")
        batch = await asyncio.to_thread(db.run_transaction, self.engine, self._sequence_in,
                                        what="sequence the transparency log")
        await self._append(batch.first, batch.entries)
        return kept + len(batch.entries)

    async def _append(self, first: int, entries: list[bytes]) -> None:
        if entries:
            await asyncio.to_thread(self.writer.append, first, entries)
            self.sequenced += len(entries)

    async def _write_along(self, sets: list[db.Writes]) -> int:
        """``sets`` into the journal's group commits, one a commit, in order (each adds to
        its commit what every stamp in it waits for: 613 stamps' entries in one took 7.7 ms,
        5 ms of CPU); how many of the batch's stamps were kept, those of the sets before the
        first one not kept. (Failed: what was kept is caught up from the database.)"""
        assert self.write_along is not None
        futures = [self.write_along(w) for w in sets]
        kept = 0
        try:
            for future, writes in zip(futures, sets, strict=True):
                if not await future:
                    break
                kept += writes.rows // 2
        finally:  # (those behind one not kept would not be kept either)
            for future in futures:
                future.cancel()
        return kept

    def _read_apart(self) -> _Batch:
        with self.reader.connect() as conn:
            return self._read_batch(conn)

    def _write_apart(self, sets: list[db.Writes]) -> bool:
        """``sets`` in a transaction of their own; whether they were kept (all of them)."""
        def work(conn: Connection) -> None:
            if sum(_run(conn, w) for w in sets) != sum(w.rows for w in sets):
                raise _Changed

        try:
            db.run_transaction(self.engine, work, what="sequence the transparency log")
        except _Changed:
            return False
        return True

    def _sequence_in(self, conn: Connection) -> _Batch:
        """Read and write a batch in one transaction (``conn``'s)."""
        batch = self._read_batch(conn, lock=conn.dialect.name == "postgresql")
        for writes in batch.writes(_param(conn)):
            if _run(conn, writes) != writes.rows:  # (nothing can change it meanwhile)
                raise RuntimeError(f"the log's entries from {batch.first} changed meanwhile")
        return batch

    def _read_batch(self, conn: Connection, *, lock: bool = False) -> _Batch:
        """Up to `BATCH` stamps not yet in the log, in journal order, and their entries;
        ``lock``: their rows locked (``FOR UPDATE``, PostgreSQL)."""
        first = int(conn.exec_driver_sql(
            "SELECT COALESCE(MAX(idx) + 1, 0) FROM tlog_entries").scalar_one())
        if first != self.writer.size:  # another process sequenced meanwhile: catch up first
            raise RuntimeError(f"the log has {first} entries, the tiles {self.writer.size}")
        # (SQL written out, rows read by the driver: at tens of thousands of rows a step,
        # SQLAlchemy's parameter and row handling would cost more than the statements)
        p = _param(conn)
        rows = conn.exec_driver_sql(
            'SELECT id, kind, "commit", object_id, algorithm, digest, stamped_at, key_id, state '
            f"FROM stamps WHERE tlog_index IS NULL AND (state IN ('{StampState.SIGNED}', "
            f"'{StampState.ORPHANED}') OR (state = '{StampState.PENDING}' AND stamped_at < {p}))"
            f" ORDER BY id LIMIT {p}{' FOR UPDATE' if lock else ''}",
            (self._orphan_cutoff(), BATCH)).fetchall()
        entries: list[bytes] = []
        for row in rows:
            signed = None
            if row[1] == "manifest":
                signed = _text_hash(conn, row[0])
            entries.append(entry_of(row[:8], self.config.fingerprints, signed))
        return _Batch(first, [row[0] for row in rows], [row[8] for row in rows], entries)

    async def _checkpoint(self) -> None:
        """Sign the head of the tiles, store the checkpoint and publish it."""
        size, root = self.writer.size, self.writer.root_hash()
        text = Checkpoint(self.config.key.origin, size, root, ()).body()
        signed = await sign_own(self.dispatcher, NoteJob(text), self.config.key_id,
                                within=SIGN_TIMEOUT, what=f"the checkpoint of size {size}")
        signature = base64.b64decode(signed.text, validate=True)
        vk = self.config.key.verifier
        signer = ed25519_signer(vk.name, vk.public_key, lambda _m: signature)
        note = sign_note(text, [signer]).encode()
        t = int(self.config.clock())
        async with self._publish_lock:
            if self.config.shared:
                await asyncio.to_thread(self._store_checkpoint, size, note, t)
            await asyncio.to_thread(self.writer.publish, note)
            self._published, self._note = size, note
        self.last_checkpoint_at = self.config.clock()

    def _offer(self) -> None:
        """Hand the published checkpoint to the witnesses, if it is new to them."""
        sender, note = self.witnesses, self._note
        if sender is None or note is None:
            return
        latest = sender.latest
        if latest is not None and parse_note(note).text == latest.text:
            return
        if latest is None:  # (first: what it carries already, from before a restart)
            sender.seed(note)
        sender.offer(Offered.of(note, Ed25519Verifier(self.config.key.verifier)))

    async def add_cosignatures(self, offered: Offered, cosignatures: list[Signature]) -> bool:
        """Add witnesses' cosignatures of ``offered`` to the published checkpoint and publish
        it again (and store it, hosts sharing a database) if it is still the newest;
        whether it was."""
        async with self._publish_lock:
            note = self._note
            if note is None or parse_note(note).text != offered.text:
                return False  # (a newer one was published meanwhile)
            order = [] if self.witnesses is None else self.witnesses.order
            merged = merge_cosignatures(note, cosignatures,
                                        Ed25519Verifier(self.config.key.verifier), order)
            if merged == note:
                return True
            if self.config.shared:
                await asyncio.to_thread(self._store_cosigned, offered.checkpoint.size, merged)
            await asyncio.to_thread(self.writer.republish, merged)
            self._note = merged
        return True

    def _store_cosigned(self, size: int, note: bytes) -> None:
        def work(conn: Connection) -> None:
            conn.execute(update(TlogCheckpoint).where(TlogCheckpoint.id == 1,
                                                      TlogCheckpoint.size == size)
                         .values(note=note.decode("utf-8")))

        db.run_transaction(self.engine, work, what="store the log's cosigned checkpoint",
                           idempotent=True)

    def _store_checkpoint(self, size: int, note: bytes, t: int) -> None:
        def work(conn: Connection) -> None:
            values = {"size": size, "note": note.decode("utf-8"), "signed_at": t}
            if conn.execute(update(TlogCheckpoint).where(TlogCheckpoint.id == 1)
                            .values(**values)).rowcount == 0:
                conn.execute(insert(TlogCheckpoint).values(id=1, **values))

        db.run_transaction(self.engine, work, what="store the log's checkpoint",
                           idempotent=True)

    def _stored_checkpoint(self) -> Any:
        """The database's checkpoint row (size, note), or None; `OriginMismatch` when it is of
        another origin than this host's (hosts of one log must agree on STAMPD_TLOG_ORIGIN)."""
        with self.reader.connect() as conn:
            row = conn.execute(select(TlogCheckpoint.size, TlogCheckpoint.note)
                               .where(TlogCheckpoint.id == 1)).first()
        if row is not None:
            self._check_origin(row.note.encode("utf-8"))
        return row

    def _follow(self) -> None:
        """Publish the database's checkpoint once this host's tiles reach its size, and again
        when its note changed (the witnesses' cosignatures were added)."""
        row = self._stored_checkpoint()
        if row is None or row.size > self.writer.size:
            return
        if self._published is not None and row.size < self._published:
            return  # (never back)
        note = row.note.encode("utf-8")
        if row.size == self._published and note == self._note:
            return
        if row.size == self._published:
            self.writer.republish(note)
        else:
            self.writer.publish(note)
        self._published, self._note = row.size, note


def _param(conn: Connection | Engine) -> str:
    return "?" if conn.dialect.paramstyle == "qmark" else "%s"


def _run(conn: Connection, writes: db.Writes) -> int:
    """Run ``writes``; the rows they changed."""
    return sum(conn.exec_driver_sql(sql, params).rowcount for sql, params in writes.statements)


def _text_hash(conn: Connection, stamp_id: int) -> str | None:
    """The SHA-256 of a signed manifest's text (read a piece at a time); None for a manifest
    not signed (published without an outcome: what pieces it has are not its text)."""
    state = conn.execute(select(Stamp.state).where(Stamp.id == stamp_id)).scalar()
    if state != StampState.SIGNED:
        return None
    h = hashlib.sha256()
    seq = 0
    while (piece := ManifestText.read(conn, stamp_id, seq)) is not None:
        h.update(piece)
        seq += 1
    return h.hexdigest() if seq else None


def fingerprints_of(keys: Sequence[Any]) -> dict[str | None, str]:
    """``key_id`` → fingerprint of the served keys (None and ``primary``: the primary key)."""
    out: dict[str | None, str] = {k.id: k.fingerprint for k in keys}
    out[None] = keys[0].fingerprint
    return out
