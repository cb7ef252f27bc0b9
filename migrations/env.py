"""Alembic environment, configured in code by `server.db.alembic_config`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from alembic import context
from sqlalchemy import Connection, create_engine

from server.models import Base

config = context.config
target_metadata = Base.metadata


@contextlib.contextmanager
def sqlite_foreign_keys_off(connection: Connection) -> Iterator[None]:
    """On SQLite, foreign key enforcement off while the migrations run; on again after.

    Batch mode changes a table by copying it into a new one, dropping it and renaming the copy;
    with enforcement on, dropping a table that other rows reference (stamps: manifest digests;
    log commits: stamps) fails. Enforcement can only be switched outside a transaction, and all
    the revisions run in one (``transactional_ddl``): so it is switched off before the
    transaction begins, and `check_sqlite_foreign_keys` checks every key before it commits."""
    if connection.dialect.name != "sqlite":
        yield
        return
    # On the driver's connection: SQLAlchemy's would begin the transaction first.
    driver = connection.connection.driver_connection
    assert driver is not None
    driver.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        try:
            driver.execute("PRAGMA foreign_keys=ON")
        except Exception:
            # Never back to the pool without enforcement (the original error, if any, is the
            # news; this one follows it).
            connection.invalidate()
            raise


def check_sqlite_foreign_keys(connection: Connection) -> None:
    """Raise if a row references a row that is not there (SQLite, where the migrations ran
    with enforcement off)."""
    if connection.dialect.name != "sqlite":
        return
    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        tables = sorted({str(row[0]) for row in broken})
        raise RuntimeError(f"the migration left {len(broken)} rows whose foreign keys "
                           f"reference nothing, in {', '.join(tables)}")


def run_migrations() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection, sqlite_foreign_keys_off(connection):
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
            compare_server_default=True,
            # SQLite's DDL is transactional too (Alembic assumes not, and would commit after
            # each revision): an upgrade or downgrade that fails leaves the schema as it was.
            transactional_ddl=True,
        )
        with context.begin_transaction():
            context.run_migrations()
            check_sqlite_foreign_keys(connection)
        connection.commit()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; use `stampd db upgrade`")
run_migrations()
