"""Engines and migrations. Alembic is configured in code (no alembic.ini needed)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, make_url

import migrations

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


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
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    command.downgrade(alembic_config(engine), revision)


def check(engine: Engine) -> None:
    """Raise if the models and the migrated schema differ (alembic's `check`)."""
    command.check(alembic_config(engine))
