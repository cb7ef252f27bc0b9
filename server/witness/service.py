"""The witness service: check an ``add-checkpoint`` request against what was last cosigned for
its log, persist the new checkpoint, then cosign it.

The order is what makes a witness safe against a crash (kill -9) at any point:

1. parse the request and read the log's row (`witness_logs`);
2. `formats.tlog.witness.check_add_checkpoint` against that row (each refusal a
   `formats.tlog.witness.WitnessError`);
3. **in one transaction**, compare and set the row: insert it when the log has none, else
   update it only where it still holds the size and root checked against. A request that
   lost a race to another of the same log re-reads the row and is refused with its size (409).
   The note stored is the checkpoint with the log's signatures only, each verified
   (`formats.tlog.witness.log_signed_note`): any other line of the request is dropped;
4. commit, and only then have a worker cosign the checkpoint with the witness key
   (`formats.jobs.CosignJob`); a cosignature is never made of a tree that is not stored;
5. store the cosigned note (that note and this witness's cosignature, nothing else) for the
   monitoring endpoint (best effort: the row's size and root are what counts; until then the
   row holds the log-signed checkpoint).

Requests that arrive together are stored together (group commit, as a journal does): one
writer task takes every request waiting, reads, checks and compares-and-sets each in turn in
**one** transaction (a request sees the rows the earlier ones of its batch set), writes the
cosigned notes made since the last batch, and commits once; only then is each request answered
or cosigned. One commit (one fsync on SQLite) carries many checkpoints.

When the cosignature cannot be made (no worker), the request is answered `CosignUnavailable`
(503): the stored row stays, and the log's retry is answered 409 with the new size, then, with
that size as its old size, the cosignature.

A request for the checkpoint already stored (old size = its size = the stored size, the same
root: a replay) changes nothing stored: it is answered with the stored cosignature while that
is at most `REPLAY_REUSE` seconds old, else cosigned afresh (the new cosigned note written as
after any cosignature). Replaying the current checkpoint makes the witness sign and write at
most once per `REPLAY_REUSE` per log.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, Table, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from formats.jobs import CosignJob
from formats.keys import WITNESS_KEY
from formats.note import ED25519_COSIGNATURE, NoteError, Verifier, VerifierKey, parse_note
from formats.tlog.checkpoint import (
    Checkpoint,
    CosignatureVerifier,
    cosign,
    cosignature_timestamp,
)
from formats.tlog.errors import TlogError
from formats.tlog.witness import (
    AddCheckpoint,
    SizeConflict,
    WitnessError,
    WitnessRecord,
    check_add_checkpoint,
    log_signed_note,
)
from server.dispatch import Dispatcher
from server.errors import Unavailable
from server.models import WitnessLog

log = logging.getLogger(__name__)
SIGN_TIMEOUT = 30.0  # seconds a cosignature may take before the request is answered 503
# Seconds the stored cosignature of a log's checkpoint answers a request for that same
# checkpoint (a replay: anyone can send it, it is public) without signing or writing again.
# Older, it is cosigned afresh, at most once per REPLAY_REUSE per log however many replay it:
# a log takes a cosignature's time only near its own clock (a stampd log within
# STAMPD_WITNESS_CLOCK_SKEW, 60 s by default).
REPLAY_REUSE = 30
_LOGS: Table = WitnessLog.__table__  # type: ignore[assignment]


class CosignUnavailable(Unavailable):
    """The checkpoint was stored but could not be cosigned now (no worker holds the witness
    key, or it failed): the log should retry; it is answered 409 then the cosignature."""

    retry_after = 5


class WitnessStoreFailed(Unavailable):
    """The database could not store a checkpoint now (nothing was cosigned): retry."""

    retry_after = 2


@dataclass(frozen=True)
class Stored:
    """One row of ``witness_logs``: what was last cosigned for ``origin``."""

    origin: str
    size: int
    root: bytes
    note: str
    updated_at: int

    @property
    def record(self) -> WitnessRecord:
        return WitnessRecord(self.size, self.root)


def monitoring_path(origin: str) -> str:
    """The path of a log's latest cosigned checkpoint: ``/<hex SHA-256 of the origin>/checkpoint``
    (the monitoring endpoint of c2sp.org/tlog-witness)."""
    return f"/{hashlib.sha256(origin.encode()).hexdigest()}/checkpoint"


def read_record(engine: Engine, origin: str) -> Stored | None:
    """The row of ``origin``; None when it was never cosigned."""
    with engine.connect() as conn:
        row = conn.execute(select(_LOGS).where(_LOGS.c.origin == origin)).first()
    return None if row is None else Stored(row.origin, row.size, bytes(row.root_hash),
                                           row.note, row.updated_at)


def read_by_hash(engine: Engine, origin_hash: str) -> Stored | None:
    """The row whose origin's SHA-256 is ``origin_hash`` (lowercase hex); None if none."""
    with engine.connect() as conn:
        origins = conn.execute(select(_LOGS.c.origin)).scalars().all()
    for origin in origins:
        if hashlib.sha256(origin.encode()).hexdigest() == origin_hash:
            return read_record(engine, origin)
    return None


def store_checkpoint(engine: Engine, checkpoint: Checkpoint, note: bytes,
                     checked: WitnessRecord | None, now: int) -> None:
    """Compare and set the row of ``checkpoint.origin`` in one transaction: insert it when
    ``checked`` is None (the log was never cosigned), else replace the row only where it still
    holds ``checked``. `SizeConflict` with the size stored now when another request changed
    the row since it was read."""
    values = {"size": checkpoint.size, "root_hash": checkpoint.root,
              "note": note.decode("utf-8"), "updated_at": now}
    origin = checkpoint.origin
    try:
        with engine.begin() as conn:
            if checked is None:
                conn.execute(insert(_LOGS).values(origin=origin, **values))
                return
            done = conn.execute(update(_LOGS).where(
                _LOGS.c.origin == origin, _LOGS.c.size == checked.size,
                _LOGS.c.root_hash == checked.root).values(**values))
            if done.rowcount == 1:
                return
    except IntegrityError:  # (inserted by another request meanwhile)
        pass
    now_stored = read_record(engine, origin)
    raise SizeConflict(0 if now_stored is None else now_stored.size)


def store_cosigned(engine: Engine, checkpoint: Checkpoint, cosigned: str) -> bool:
    """Keep the cosigned note in the row, if it still holds ``checkpoint`` (a newer one may
    have replaced it meanwhile); whether it did."""
    with engine.begin() as conn:
        done = conn.execute(update(_LOGS).where(
            _LOGS.c.origin == checkpoint.origin, _LOGS.c.size == checkpoint.size,
            _LOGS.c.root_hash == checkpoint.root).values(note=cosigned))
    return bool(done.rowcount == 1)


def _set_row(conn: Connection, checkpoint: Checkpoint, note: bytes,
             checked: WitnessRecord | None, now: int) -> bool:
    """The compare and set of `store_checkpoint` inside the transaction of ``conn`` (an
    insert that conflicts does nothing: no error aborts the transaction); whether it set."""
    values = {"size": checkpoint.size, "root_hash": checkpoint.root,
              "note": note.decode("utf-8"), "updated_at": now}
    if checked is None:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        done = conn.execute(dialect.insert(_LOGS).values(origin=checkpoint.origin, **values)
                            .on_conflict_do_nothing(index_elements=["origin"]))
    else:
        done = conn.execute(update(_LOGS).where(
            _LOGS.c.origin == checkpoint.origin, _LOGS.c.size == checked.size,
            _LOGS.c.root_hash == checked.root).values(**values))
    return bool(done.rowcount == 1)


def _record_in(conn: Connection, origin: str | None) -> WitnessRecord | None:
    if origin is None:
        return None
    row = conn.execute(select(_LOGS.c.size, _LOGS.c.root_hash)
                       .where(_LOGS.c.origin == origin)).first()
    return None if row is None else WitnessRecord(row.size, bytes(row.root_hash))


def _note_in(conn: Connection, origin: str) -> str | None:
    return conn.execute(select(_LOGS.c.note).where(_LOGS.c.origin == origin)).scalar()


@dataclass(frozen=True)
class Accepted:
    """A request's checkpoint as checked and stored: the checkpoint, and its note with the
    log's signatures only (`log_signed_note`), which the cosignature is appended to; for a
    replay answered from the store, the stored cosignature ``line`` (nothing to sign)."""

    checkpoint: Checkpoint
    note: bytes
    line: bytes | None = None


_Waiting = tuple[AddCheckpoint, "asyncio.Future[Accepted]"]


class Witness:
    """A witness of the logs of ``trusted`` (each origin's checkpoint keys), cosigning as
    ``name`` with the witness key (its Ed25519 ``public_key``, 32 bytes), held by the
    workers of ``dispatcher``; ``clock`` gives the cosignatures' time."""

    def __init__(self, engine: Engine, dispatcher: Dispatcher,
                 trusted: Mapping[str, Sequence[Verifier]], name: str, public_key: bytes,
                 clock: Callable[[], float], key_id: str = WITNESS_KEY.id) -> None:
        self.engine = engine
        self.dispatcher = dispatcher
        self.trusted = {origin: list(keys) for origin, keys in trusted.items()}
        self.name = name
        self.public_key = public_key
        self.clock = clock
        self.key_id = key_id
        self._own = CosignatureVerifier(VerifierKey(name, ED25519_COSIGNATURE, public_key))
        self._waiting: list[_Waiting] = []
        self._notes: list[tuple[Checkpoint, str]] = []  # cosigned notes not yet written
        self._writer: asyncio.Task[None] | None = None

    async def add_checkpoint(self, body: bytes) -> bytes:
        """The cosignature line(s) of the checkpoint of the ``add-checkpoint`` request
        ``body``, stored before it is cosigned; a `WitnessError` for each refusal,
        `CosignUnavailable` when it was stored but cannot be cosigned now."""
        request = AddCheckpoint.parse(body)
        future: asyncio.Future[Accepted] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        accepted = await future
        if accepted.line is not None:  # (a replay, answered from the store)
            return accepted.line
        return await self.cosign(accepted.checkpoint, accepted.note)

    async def _write(self) -> None:
        """Store the waiting requests, batch after batch, until none waits."""
        while self._waiting:
            batch, self._waiting = self._waiting, []
            notes, self._notes = self._notes, []
            try:
                results = await asyncio.to_thread(self._store_batch, [r for r, _ in batch],
                                                  notes)
            except SQLAlchemyError as e:
                log.warning("witness: cannot store %d checkpoints: %s", len(batch), e)
                results = [WitnessStoreFailed("the checkpoint cannot be stored now; retry")
                           ] * len(batch)
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():  # (its request was cancelled)
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _store_batch(self, requests: list[AddCheckpoint], notes: list[tuple[Checkpoint, str]]
                     ) -> list[Accepted | Exception]:
        """Check and compare-and-set each request in turn in one transaction, and write the
        cosigned ``notes``: each request's checkpoint as stored, or its refusal."""
        out: list[Accepted | Exception] = []
        now = self._now()
        with self.engine.begin() as conn:
            for checkpoint, cosigned in notes:
                conn.execute(update(_LOGS).where(
                    _LOGS.c.origin == checkpoint.origin, _LOGS.c.size == checkpoint.size,
                    _LOGS.c.root_hash == checkpoint.root).values(note=cosigned))
            for request in requests:
                checked = _record_in(conn, _origin_of(request))
                try:
                    checkpoint = check_add_checkpoint(request, self.trusted, checked)
                    note = log_signed_note(request.checkpoint, self.trusted[checkpoint.origin])
                except WitnessError as e:
                    out.append(e)
                    continue
                if checked is not None and checked.size == checkpoint.size:
                    # a replay (the check compared the roots): nothing to store
                    out.append(Accepted(checkpoint, note,
                                        self._fresh_line(_note_in(conn, checkpoint.origin), now)))
                elif _set_row(conn, checkpoint, note, checked, now):
                    out.append(Accepted(checkpoint, note))
                else:  # (another process of this host set it meanwhile)
                    known = _record_in(conn, checkpoint.origin)
                    out.append(SizeConflict(0 if known is None else known.size))
        return out

    def store(self, request: AddCheckpoint) -> Checkpoint:
        """Check ``request`` against the stored row of its log and store its checkpoint
        (compare and set, committed): the checkpoint stored."""
        origin = _origin_of(request)
        stored = None if origin is None else read_record(self.engine, origin)
        checked = None if stored is None else stored.record
        checkpoint = check_add_checkpoint(request, self.trusted, checked)
        note = log_signed_note(request.checkpoint, self.trusted[checkpoint.origin])
        store_checkpoint(self.engine, checkpoint, note, checked, self._now())
        return checkpoint

    async def cosign(self, checkpoint: Checkpoint, note: bytes) -> bytes:
        """Have the witness key cosign the stored ``checkpoint`` (its ``note`` as stored, the
        log's signatures only): the signature line; the cosigned note (that note and the
        line) is kept for the monitoring endpoint."""
        timestamp = self._now()
        body = parse_note(note).text  # (the text as the log signed it, checked before)
        try:
            async with asyncio.timeout(SIGN_TIMEOUT):
                signed = await self.dispatcher.sign(CosignJob(body, timestamp), key=self.key_id)
            signature = base64.b64decode(signed.text, validate=True)
            line = cosign(body, self.name, self.public_key, timestamp,
                          lambda _m: signature).line()
        except (Unavailable, TimeoutError, binascii.Error, TlogError) as e:
            log.warning("witness: cannot cosign %s at size %d: %s", checkpoint.origin,
                        checkpoint.size, e)
            raise CosignUnavailable("the checkpoint is stored but cannot be cosigned now; "
                                    "retry (with the size stored as the old size)") from None
        # (best effort, written with the next batch: the cosignature is good without it)
        self._notes.append((checkpoint, note.decode("utf-8") + line))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_notes())
        return line.encode("utf-8")

    async def _write_notes(self) -> None:
        """Write the cosigned notes when no request brings a batch to write them with."""
        if self._waiting or not self._notes:
            await self._write()
            return
        notes, self._notes = self._notes, []
        try:
            await asyncio.to_thread(self._store_batch, [], notes)
        except SQLAlchemyError as e:
            log.warning("witness: %d cosigned notes not kept: %s", len(notes), e)
        if self._waiting:
            await self._write()

    def _fresh_line(self, note: str | None, now: int) -> bytes | None:
        """This witness's cosignature line of the stored ``note`` (the last one, verified),
        if it is at most `REPLAY_REUSE` seconds old at ``now``; None (cosign afresh)
        otherwise."""
        if note is None:
            return None
        try:
            parsed = parse_note(note.encode("utf-8"))
        except NoteError:
            return None
        own = [s for s in parsed.signatures
               if (s.name, s.key_id) == (self._own.name, self._own.key_id)]
        if not own or not self._own.verify(parsed.text.encode("utf-8"), own[-1].signature):
            return None
        age = now - cosignature_timestamp(own[-1].signature)  # (it verified: a valid time)
        return own[-1].line().encode("utf-8") if 0 <= age <= REPLAY_REUSE else None

    def _now(self) -> int:
        t = int(self.clock())
        if t <= 0:
            raise CosignUnavailable(f"the witness's clock reads {t}")
        return t


def _origin_of(request: AddCheckpoint) -> str | None:
    """The origin (first line) of the request's checkpoint, to read its row; None when the
    checkpoint has none (the check refuses it)."""
    first, sep, _ = request.checkpoint.partition(b"\n")
    if not sep:
        return None
    try:
        return first.decode("utf-8")
    except UnicodeDecodeError:
        return None
