"""Engines and migrations. Alembic is configured in code (no alembic.ini needed)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine, RootTransaction, create_engine, event, make_url, text
from sqlalchemy import exc as sa_exc

import migrations

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent

T = TypeVar("T")


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL; None for other databases, in-memory databases and
    ``uri=true`` URLs."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or u.query.get("uri"):
        return None
    if not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def _create_private(path: Path) -> None:
    """Create the database file 0600 before SQLite opens it (SQLite would create it 0644 under
    the usual umask); SQLite gives its -wal and -shm files the database file's mode. An existing
    file is left as it is; a missing directory is left for SQLite to report."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except (FileExistsError, FileNotFoundError):
        return
    try:
        os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Writes:
    """Statements made by one writer for another's transaction (`server.stamping.journal.
    Journal.write_along`: the sequencer's, into the journal's next group commit, so that it
    never waits for SQLite's write lock, nor the journal for it): each SQL in the database's
    own parameter style, with its parameters. All or none: they are kept only when they
    change ``rows`` rows in all, which is how they say that what they were made from is
    still so; they must not raise on a database that is up."""

    statements: tuple[tuple[str, tuple[Any, ...]], ...]
    rows: int


# Execution option of an engine or connection whose transactions only read (see `reading`).
READ_ONLY = "stampd_read_only"


def reading(engine: Engine) -> Engine:
    """``engine`` for transactions that only read. On SQLite every other transaction begins
    IMMEDIATE, taking the database's one write lock for as long as it lasts: a reader doing so
    would hold up the journal's group commits (and so every stamp) while it reads."""
    return engine.execution_options(**{READ_ONLY: True})


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine with durable settings: SQLite in WAL mode with synchronous=FULL, its file
    created private (0600, like the keys)."""
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path is not None:
            _create_private(path)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy emit BEGIN itself (pysqlite's implicit transactions are off).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            # A writer takes the write lock at once (upgrading a read lock later could fail
            # with SQLITE_BUSY); a reader (`reading`) takes a snapshot and no lock.
            read_only = conn.get_execution_options().get(READ_ONLY, False)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


# Alembic is imported where it is used: it costs 0.4 s of CPU to import, and only the process
# that migrates (or the CLI) needs it, not every HTTP process.


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    # Alembic's Config defaults its stdout to the sys.stdout of the moment alembic was first
    # imported, which may be a stream closed since (a test's capture); use the current one.
    cfg = Config(stdout=sys.stdout)
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    cfg.attributes["engine"] = engine
    return cfg


# The newest migration's revision. Start-up reads the database's revision and leaves Alembic
# alone (0.3 s of CPU to import and run) when it is this one; a test checks that it is
# Alembic's head, so a new migration must change it.
SCHEMA_HEAD = "0016"


def current_revision(engine: Engine) -> str | None:
    """The database's schema revision (Alembic's version table); None for an empty database."""
    with reading(engine).connect() as conn:  # (no write lock: a running server may hold it)
        if not engine.dialect.has_table(conn, "alembic_version"):
            return None
        value = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        return None if value is None else str(value)


def revisions() -> list[str]:
    """The schema revisions this release knows, oldest first (``migrations/versions/NNNN_*``)."""
    found = (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")
    return sorted(p.name[:4] for p in found)


def upgrade(engine: Engine, revision: str = "head") -> None:
    if revision == "head" and current_revision(engine) == SCHEMA_HEAD:
        return
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(engine), revision)


def check(engine: Engine) -> None:
    """Raise if the models and the migrated schema differ (alembic's `check`)."""
    from alembic import command

    command.check(alembic_config(engine))


# -- transient errors (PostgreSQL) -----------------------------------------------------------
#
# Under contention PostgreSQL aborts a transaction that would deadlock (40P01) or, at
# REPEATABLE READ and above, one that lost a race for a row (40001); it has been rolled back,
# and running it again usually succeeds. A dropped connection (the server restarted, a
# connection killed) rolls back what was open too, with one exception: when the connection is
# lost while COMMIT is under way, nobody knows whether the transaction committed. That case is
# `CommitUnknown`, never retried unless running the transaction twice is the same as once.

DEADLOCK_DETECTED = "40P01"
SERIALIZATION_FAILURE = "40001"
RETRY_SQLSTATES = frozenset({DEADLOCK_DETECTED, SERIALIZATION_FAILURE})
# Besides class 08 (connection exception): admin_shutdown, crash_shutdown, cannot_connect_now
# (a server starting or recovering), too_many_connections (refused before anything ran).
DISCONNECT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})

RETRY_ATTEMPTS = 6  # runs in all, the first included: waits of at most 0.62 s in all
RETRY_BASE = 0.02  # seconds before the second run; doubling, jittered
RETRY_CAP = 0.5  # the longest wait between two runs


class CommitUnknown(Exception):
    """The connection was lost while COMMIT was under way: the transaction may or may not have
    committed. Not transient: running it again could apply it twice."""


def _driver_error(exc: BaseException) -> BaseException:
    """The driver's exception behind a SQLAlchemy one (``exc`` itself otherwise)."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None:
        return exc.orig
    return exc


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error (psycopg's, or SQLAlchemy's wrapping it); None for
    errors without one (SQLite's, a connection that broke, anything else)."""
    code = getattr(_driver_error(exc), "sqlstate", None)
    return code if isinstance(code, str) else None


def is_disconnect(exc: BaseException) -> bool:
    """Was the connection lost or refused (the server went away, restarted, was unreachable)?"""
    if isinstance(exc, CommitUnknown):
        return False
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    code = sqlstate(exc)
    if code is not None:
        return code.startswith("08") or code in DISCONNECT_SQLSTATES
    orig = _driver_error(exc)
    if type(orig).__module__.partition(".")[0] != "psycopg":
        return False
    import psycopg  # (already imported: the error is psycopg's)

    # psycopg raises OperationalError without a SQLSTATE when the connection breaks ("server
    # closed the connection unexpectedly", "the connection is closed") or cannot be made.
    return isinstance(orig, psycopg.OperationalError)


def is_transient(exc: BaseException) -> bool:
    """Would running the transaction again probably succeed (deadlock, serialization failure,
    lost connection)? False for `CommitUnknown` and for every other error."""
    return sqlstate(exc) in RETRY_SQLSTATES or is_disconnect(exc)


def backoff(attempt: int, base: float = RETRY_BASE, cap: float = RETRY_CAP) -> float:
    """Seconds to wait after the ``attempt``-th failed run (1, 2, ...): half of
    ``base * 2**(attempt-1)`` (at most ``cap``) plus a random share of the other half, so that
    two transactions that deadlocked each other do not run into each other again."""
    ceiling = min(cap, base * 2 ** (attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def retry_transient(run: Callable[[], T], *, what: str, attempts: int = RETRY_ATTEMPTS,
                    sleep: Callable[[float], None] = time.sleep,
                    on_retry: Callable[[BaseException], None] | None = None) -> T:
    """``run()``, run again after a transient error (`is_transient`) up to ``attempts`` runs in
    all; the last error, and any other error at once, is raised. ``run`` must be a whole
    transaction that leaves nothing behind when it raises (`run_transaction`)."""
    for attempt in range(1, attempts + 1):
        try:
            return run()
        except Exception as e:
            if attempt >= attempts or not is_transient(e):
                raise
            delay = backoff(attempt)
            log.warning("%s: %s (SQLSTATE %s); running it again in %.0f ms (%d of %d)",
                        what, type(_driver_error(e)).__name__, sqlstate(e) or "-",
                        delay * 1000, attempt + 1, attempts)
            if on_retry is not None:
                on_retry(e)
            sleep(delay)
    raise AssertionError("unreachable")  # (the loop returns or raises)


def commit(tx: RootTransaction, *, idempotent: bool) -> None:
    """Commit ``tx``. A connection lost during COMMIT raises `CommitUnknown` unless the
    transaction is ``idempotent`` (running it twice leaves what running it once does), in which
    case the error stays transient and the caller may simply run it again."""
    try:
        tx.commit()
    except Exception as e:
        if not idempotent and is_disconnect(e):
            raise CommitUnknown(f"connection lost during COMMIT: {e}") from e
        raise


def run_transaction(engine: Engine, work: Callable[[Connection], T], *, what: str,
                    idempotent: bool = False, attempts: int = RETRY_ATTEMPTS,
                    sleep: Callable[[float], None] = time.sleep,
                    on_retry: Callable[[BaseException], None] | None = None) -> T:
    """``work(conn)`` in a transaction of its own on a pooled connection, committed; run again
    after a transient error (`retry_transient`). ``work`` may run several times: it must not
    keep state of a failed run. See `commit` for ``idempotent``."""

    def once() -> T:
        with engine.connect() as conn:
            tx = conn.begin()
            try:
                result = work(conn)
            except BaseException:
                with contextlib.suppress(Exception):  # (the original error is the news)
                    tx.rollback()
                raise
            commit(tx, idempotent=idempotent)
            return result

    return retry_transient(once, what=what, attempts=attempts, sleep=sleep, on_retry=on_retry)
