"""How the journal's group commits reach the database (`server.stamping.journal`): one
connection kept by the journal's thread, through SQLAlchemy on any database
(`SqlAlchemyWriter`), or sqlite3 itself on a SQLite file (`SqliteWriter`).

Both also run other writers' statements in a group commit (`server.db.Writes`, the
transparency log's entries): each set in a savepoint, rolled back to it when they did not
change the rows they should have."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Connection, Engine, Table, bindparam, func, insert, or_, update
from sqlalchemy.dialects import postgresql, sqlite

from server import db
from server.models import ManifestDigests, ManifestText, Stamp, StampState

log = logging.getLogger(__name__)

# The states whose stamp takes an outcome: pending, and orphaned (published by the logs as
# pending too long: a process that was only stalled may record its outcome after all).
OUTCOME_PENDING = (StampState.PENDING, StampState.ORPHANED)
IndexRow = tuple[int, bytes, str, bytes]  # manifest_digests: stamp id, prefix, algorithm, digests
Piece = tuple[int, int, bytes]  # manifest_texts: stamp id, seq, piece
CHECKPOINT_EVERY = 0.5  # seconds between the SQLite journal's WAL checkpoints, after commits


INSERT_COLUMNS = ("kind", "commit", "tagname", "tree", "parent", "algorithm", "digest",
                  "stamped_at", "key_id", "state", "attempts")


class Writer:
    """Holds the journal thread's one connection; a failed write drops it (rolling back
    whatever was open) and the next write connects anew."""

    conn: Connection | sqlite3.Connection | None = None
    retries = 0  # transactions run again after a transient error

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None

    def shutdown(self) -> None:
        """The journal stops: close for good."""
        self.close()


class SqlAlchemyWriter(Writer):
    """Any database: one connection kept open by the journal thread (no pool round trip).

    On PostgreSQL several API hosts (and the log committer) write ``stamps`` at once, so two
    rules keep a group commit from deadlocking or failing a whole group under contention:

    - Row locks are taken in one order. The only existing rows a group commit locks are those
      its outcomes update, one statement per row in ascending id order (a stable sort, so two
      outcomes of one stamp keep theirs). Every writer that follows the same order waits for
      the other's commit instead of holding a row the other waits for; inserted rows are new
      and no other transaction waits for them (the ids come from a sequence).
    - A transient error (`server.db.is_transient`: deadlock, serialization failure, a lost
      connection) rolls the group back; it is run again, a bounded number of times. That is
      idempotent: the outcomes only touch rows without one (``pending``, ``orphaned``) and set
      the same values again, and a group that inserts requests is never run again after the
      connection was lost during its COMMIT (`server.db.CommitUnknown`: it may have
      committed): its requests fail (503) and nothing is recorded twice.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.conn: Connection | None = None
        self.retries = 0  # groups run again after a transient error (for tests and logs)

    def write(self, rows: list[dict[str, Any]], updates: list[dict[str, Any]],
              index: list[IndexRow], pieces: list[Piece], along: Sequence[db.Writes] = ()
              ) -> tuple[list[int], list[bool]]:
        ordered = sorted(updates, key=lambda u: int(u["sid"]))
        return db.retry_transient(lambda: self._write(rows, ordered, index, pieces, along),
                                  what="journal write", on_retry=self._retried)

    def _retried(self, _error: BaseException) -> None:
        self.retries += 1

    def _write(self, rows: list[dict[str, Any]], updates: list[dict[str, Any]],
               index: list[IndexRow], pieces: list[Piece], along: Sequence[db.Writes]
               ) -> tuple[list[int], list[bool]]:
        if self.conn is None or self.conn.closed or self.conn.invalidated:
            self.conn = self.engine.connect()
        table = cast(Table, Stamp.__table__)
        try:
            tx = self.conn.begin()
            try:
                ids: list[int] = []
                if rows:
                    result = self.conn.execute(
                        insert(table).returning(table.c.id, sort_by_parameter_order=True),
                        [{**r, "state": StampState.PENDING, "attempts": 0} for r in rows],
                    )
                    ids = [row[0] for row in result]
                if index:
                    self._insert_index(index)
                if pieces:
                    self._insert_pieces(pieces)
                if updates:
                    self.conn.execute(
                        update(table)
                        .where(table.c.id == bindparam("sid"),
                               # (no IN: an expanding parameter, not in an executemany)
                               or_(*(table.c.state == s for s in OUTCOME_PENDING)))
                        .values(state=bindparam("state"), worker=bindparam("worker"),
                                attempts=func.coalesce(bindparam("attempts"), table.c.attempts),
                                object_id=bindparam("object_id"), error=bindparam("error"),
                                receipt=bindparam("receipt")),
                        updates,
                    )
                kept = [self._along(w) for w in along]
            except BaseException:
                with contextlib.suppress(Exception):
                    tx.rollback()
                raise
            # Outcomes and text pieces (written again as they are) may be committed twice;
            # inserted requests and index rows may not. (Other writers' statements are
            # guarded: run again after they were committed, they are not kept.)
            db.commit(tx, idempotent=not rows and not index)
            return ids, kept
        except Exception:
            self.close()
            raise


    def _along(self, writes: db.Writes) -> bool:
        """Run ``writes`` in a savepoint; whether they were kept."""
        assert self.conn is not None
        savepoint = self.conn.begin_nested()
        changed = sum(self.conn.exec_driver_sql(sql, params).rowcount
                      for sql, params in writes.statements)
        if changed != writes.rows:
            savepoint.rollback()
            return False
        savepoint.commit()
        return True

    def _insert_index(self, rows: list[IndexRow]) -> None:
        """A slice of manifests' digest index rows (about 65,536 for a million digests in
        all): COPY on PostgreSQL (a third of the time of an executemany INSERT here)."""
        assert self.conn is not None
        if self.engine.dialect.name != "postgresql":
            self.conn.execute(insert(cast(Table, ManifestDigests.__table__)), [
                {"stamp_id": sid, "prefix": prefix, "algorithm": algorithm, "digests": packed}
                for sid, prefix, algorithm, packed in rows])
            return
        raw = self.conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur, cur.copy(
                "COPY manifest_digests (stamp_id, prefix, algorithm, digests) "
                "FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "bytea", "varchar", "bytea"])
            for row in rows:
                copy.write_row(row)

    def _insert_pieces(self, pieces: list[Piece]) -> None:
        """Pieces of signed texts, written again as they are where they already are (a group
        run again after a lost COMMIT)."""
        assert self.conn is not None
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(cast(Table, ManifestText.__table__))
        self.conn.execute(
            stmt.on_conflict_do_update(index_elements=["stamp_id", "seq"],
                                       set_={"piece": stmt.excluded.piece}),
            [{"stamp_id": sid, "seq": seq, "piece": piece} for sid, seq, piece in pieces])


class SqliteWriter(Writer):
    """SQLite: the journal thread's own sqlite3 connection and prepared statements.

    The same SQL SQLAlchemy would emit, without its per-statement work, which dominated the
    journal's cost at thousands of stamps per second. One multi-row INSERT per group; rowids
    are assigned in VALUES order while the write lock is held, so the sorted RETURNING ids
    match the rows.
    """

    CHUNK = 200  # rows per INSERT (x 11 parameters, far below SQLite's variable limit)
    # Only a stamp without an outcome takes one (a re-applied update must not undo the log
    # committer's marking of a failed stamp).
    UPDATE = ("UPDATE stamps SET state = ?, worker = ?, attempts = COALESCE(?, attempts), "
              "object_id = ?, error = ?, receipt = ? WHERE id = ? "
              f"AND state IN ('{StampState.PENDING}', '{StampState.ORPHANED}')")

    # Index rows go in `CHUNK` at a time: each statement run gives the GIL up and takes it
    # back, and with a manifest checked in another thread of the process meanwhile each
    # taking back waits for its turn (an executemany of a slice's ~2,000 rows took seconds).
    INDEX = "INSERT INTO manifest_digests (stamp_id, prefix, algorithm, digests) VALUES "

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn: sqlite3.Connection | None = None
        self._inserts: dict[int, str] = {}
        self._written = threading.Event()  # a commit since the last checkpoint
        self._stopping = threading.Event()
        self._checkpointer: threading.Thread | None = None

    def _open(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, isolation_level=None, timeout=30,
                               check_same_thread=False)

    def _connect(self) -> sqlite3.Connection:
        conn = self._open()
        # No checkpoint in a commit: the commit that filled the WAL past 1000 pages copied
        # them into the database and synced it (tens of ms more, beside a manifest's bulk
        # writes), and every stamp's commit waiting behind it waited as long. The
        # checkpointer thread does it instead, beside the commits (`_checkpoints`).
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON",
                       "busy_timeout=30000", "wal_autocheckpoint=0"):
            conn.execute(f"PRAGMA {pragma}")
        if self._checkpointer is None:
            self._checkpointer = threading.Thread(target=self._checkpoints, daemon=True,
                                                  name="journal-checkpoint")
            self._checkpointer.start()
        return conn

    def _checkpoints(self) -> None:
        """Every `CHECKPOINT_EVERY` seconds after a commit, a PASSIVE checkpoint on a
        connection of its own (what SQLite's automatic checkpoint does, out of the commit's
        way: WAL mode lets a checkpoint run beside a writer). Ends when the journal stops."""
        conn: sqlite3.Connection | None = None
        while not self._stopping.wait(CHECKPOINT_EVERY):
            if not self._written.is_set():
                continue
            self._written.clear()
            try:
                conn = conn or self._open()
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as e:
                log.warning("journal: WAL checkpoint failed (tried again): %s", e)
                self._written.set()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def shutdown(self) -> None:
        self._stopping.set()
        if self._checkpointer is not None:
            self._checkpointer.join(timeout=30)
        self.close()

    @staticmethod
    def _along(conn: sqlite3.Connection, writes: db.Writes) -> bool:
        """Run ``writes`` in a savepoint; whether they were kept."""
        conn.execute("SAVEPOINT along")
        changed = sum(conn.execute(sql, params).rowcount for sql, params in writes.statements)
        if changed != writes.rows:
            conn.execute("ROLLBACK TO along")
        conn.execute("RELEASE along")
        return changed == writes.rows

    def _insert_sql(self, n: int) -> str:
        sql = self._inserts.get(n)
        if sql is None:
            cols = ", ".join(f'"{c}"' for c in INSERT_COLUMNS)
            one = "(" + ", ".join("?" * len(INSERT_COLUMNS)) + ")"
            sql = f"INSERT INTO stamps ({cols}) VALUES {', '.join([one] * n)} RETURNING id"
            self._inserts[n] = sql
        return sql

    def write(self, rows: list[dict[str, Any]], updates: list[dict[str, Any]],
              index: list[IndexRow], pieces: list[Piece], along: Sequence[db.Writes] = ()
              ) -> tuple[list[int], list[bool]]:
        conn = self.conn = self.conn or self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            ids: list[int] = []
            for i in range(0, len(rows), self.CHUNK):
                chunk = rows[i:i + self.CHUNK]
                params = [v for r in chunk for v in (
                    r["kind"], r["commit"], r["tagname"], r["tree"], r["parent"],
                    r["algorithm"], r["digest"], r["stamped_at"], r["key_id"],
                    StampState.PENDING, 0)]
                got = sorted(row[0] for row in conn.execute(self._insert_sql(len(chunk)), params))
                if len(got) != len(chunk):
                    raise RuntimeError("INSERT returned the wrong number of ids")
                ids += got
            for i in range(0, len(index), self.CHUNK):  # (few statements: see `INDEX`)
                rows_of = index[i:i + self.CHUNK]
                conn.execute(self.INDEX + ", ".join(["(?, ?, ?, ?)"] * len(rows_of)),
                             [v for row in rows_of for v in row])
            if pieces:
                conn.executemany(
                    "INSERT OR REPLACE INTO manifest_texts (stamp_id, seq, piece) "
                    "VALUES (?, ?, ?)", pieces)
            if updates:
                conn.executemany(self.UPDATE, [
                    (u["state"], u["worker"], u["attempts"], u["object_id"], u["error"],
                     u["receipt"], u["sid"])
                    for u in updates])
            kept = [self._along(conn, w) for w in along]
            conn.execute("COMMIT")
            self._written.set()
            return ids, kept
        except BaseException:
            self.close()
            raise

