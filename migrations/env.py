"""Alembic environment, configured in code by `server.db.alembic_config`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from server.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
            # SQLite's DDL is transactional too (Alembic assumes not, and would commit after
            # each revision): an upgrade or downgrade that fails leaves the schema as it was.
            transactional_ddl=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; use `stampd db upgrade`")
run_migrations()
