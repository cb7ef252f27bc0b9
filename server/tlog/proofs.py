"""A stamp's place in the transparency log, and its proof (``/v1/proofs``, docs/transparency.md).

`locate` finds one stamp by its serial or by a git object id; `locate_many` finds many in a
few queries (the proof waiters of an HTTP process, looked up together when a checkpoint is
published: `server.tlog.waiters`); `prove` makes a ``c2sp.org/tlog-proof@v1`` from the tiles
and the published checkpoint. Each blocks (database, files): call them in a thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from formats.tlog.merkle import inclusion_proof
from formats.tlog.proof import TlogProof
from server.db import reading
from server.errors import NotFound
from server.models import StampState
from server.tlog.store import TileReader

_FAILED = (StampState.FAILED, StampState.FAILED_UNLOGGED)
CHUNK = 500  # ids in one IN (...) of `locate_many`


@dataclass(frozen=True)
class Located:
    """A stamp found: its serial, and its index and entry once it is sequenced."""

    serial: int
    index: int | None  # None: not sequenced yet
    entry: bytes | None = None
    failed: bool = False  # failed: never in the log

    @property
    def what(self) -> str:
        return f"stamp {self.serial}"


class UnknownGitObject(NotFound):
    """No stamp with this git object id (yet: a git stamp's object id is journalled just after
    its answer)."""

    def __init__(self, object_id: str) -> None:
        super().__init__(f"no stamp with the git object {object_id} (a signed tag or commit "
                         "this server answered, or a commit it stamped); a stamp whose answer "
                         "was never journalled is found by the commit it stamped")


def unknown_serial(serial: int) -> NotFound:
    return NotFound(f"no stamp {serial} on this server")


def failed(located: Located, what: str | None = None) -> NotFound:
    return NotFound(f"{what or located.what} failed (the client got an error): it is not in "
                    "the log")


_LOCATE = ("SELECT s.id, s.state, s.tlog_index, e.entry FROM stamps s "
           "LEFT JOIN tlog_entries e ON e.idx = s.tlog_index WHERE ")
# (SQL written out and run by the driver: a proof is served in a few milliseconds, of which
# SQLAlchemy's statement handling would take a tenth)
_BY = {
    "serial": "s.id = {p}",
    "object": "s.object_id = {p} ORDER BY s.id LIMIT 1",
    # the commit stamped: its first stamp in the log
    "commit": 's."commit" = {p} AND s.tlog_index IS NOT NULL ORDER BY s.tlog_index LIMIT 1',
}


def _param(conn: Any) -> str:
    return "?" if conn.dialect.paramstyle == "qmark" else "%s"


def locate(engine: Engine, serial: int | None, object_id: str | None) -> Located:
    """The stamp asked for (``serial``, else ``object_id``). `NotFound` when there is none
    (`UnknownGitObject` for an object id) or it failed."""
    with reading(engine).connect() as conn:
        p = _param(conn)

        def first(by: str, value: object) -> Any:
            return conn.exec_driver_sql(_LOCATE + _BY[by].format(p=p), (value,)).first()

        if serial is not None:
            row = first("serial", serial)
            what = f"stamp {serial}"
        else:
            row = first("object", object_id) or first("commit", object_id)
            what = f"git object {object_id}"
    if row is None:
        if object_id is not None:
            raise UnknownGitObject(object_id)
        raise unknown_serial(serial or 0)
    sid, state, index, entry = row
    located = Located(sid, index, None if entry is None else bytes(entry),
                      failed=index is None and state in _FAILED)
    if located.failed:
        raise failed(located, what)
    return located


def locate_many(engine: Engine, serials: Sequence[int], object_ids: Sequence[str]
                ) -> tuple[dict[int, Located], dict[str, Located]]:
    """The stamps of ``serials`` and of ``object_ids``, as `locate` would find each (failed
    ones marked, not raised; unknown ones left out), without their entries; in a query per
    `CHUNK` of each kind (two for object ids)."""
    by_serial: dict[int, Located] = {}
    by_object: dict[str, Located] = {}
    with reading(engine).connect() as conn:
        p = _param(conn)
        for i in range(0, len(serials), CHUNK):
            part = serials[i:i + CHUNK]
            rows = conn.exec_driver_sql(
                "SELECT id, state, tlog_index FROM stamps WHERE id IN "
                f"({', '.join([p] * len(part))})", tuple(part)).all()
            for sid, state, index in rows:
                by_serial[sid] = Located(sid, index, failed=index is None and state in _FAILED)
        for i in range(0, len(object_ids), CHUNK):
            ids = object_ids[i:i + CHUNK]
            # By the object answered: its first stamp (as `locate`), whatever its state.
            for sid, oid, state, index in conn.exec_driver_sql(
                    "SELECT id, object_id, state, tlog_index FROM stamps WHERE object_id IN "
                    f"({', '.join([p] * len(ids))}) ORDER BY id", tuple(ids)):
                if oid not in by_object:
                    by_object[oid] = Located(sid, index,
                                             failed=index is None and state in _FAILED)
            # By the commit stamped: its first stamp in the log.
            rest = [o for o in ids if o not in by_object]
            if rest:
                for sid, commit, index in conn.exec_driver_sql(
                        f'SELECT id, "commit", tlog_index FROM stamps WHERE "commit" IN '
                        f"({', '.join([p] * len(rest))}) AND tlog_index IS NOT NULL "
                        "ORDER BY tlog_index", tuple(rest)):
                    by_object.setdefault(commit, Located(sid, index))
    return by_serial, by_object


def prove(r: TileReader, index: int, entry: bytes | None = None) -> bytes | None:
    """The proof of entry ``index`` (``entry``: its bytes, else read from its bundle) at the
    published checkpoint; None while no checkpoint covers it."""
    published = r.published()
    if published is None or index >= published[1]:
        return None
    note, size = published
    hashes = inclusion_proof(index, size, r.node_reader(size))
    if entry is None:
        entry = r.entry(index, size)
    return TlogProof(index, tuple(hashes), note, extra=entry).encode()


def locate_and_prove(engine: Engine, r: TileReader, serial: int | None, object_id: str | None,
                     located: Located | None) -> tuple[Located, bytes | None]:
    """(the stamp, its proof or None): one thread hop for both; ``located``, when it has its
    index, is not looked up again."""
    if located is None or located.index is None:
        located = locate(engine, serial, object_id)
    if located.index is None:
        return located, None
    return located, prove(r, located.index, located.entry)
