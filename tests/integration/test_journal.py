"""The journal on SQLite and PostgreSQL: durable before answered, grouped commits, migrations."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text

from server import db
from server.errors import JournalError
from server.models import Stamp, StampState
from server.stamping.journal import Journal
from server.stamping.requests import BranchRequest, TagRequest


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'j.sqlite3'}"
    else:
        url = request.getfixturevalue("pg_url")
    eng = db.make_engine(url)
    db.upgrade(eng)
    yield eng
    if request.param == "postgres":
        db.downgrade(eng, "base")
    eng.dispose()


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Stamp)).scalar_one())


def test_schema_matches_models_and_round_trips(engine: Engine) -> None:
    db.check(engine)
    db.downgrade(engine, "base")
    with engine.connect() as conn:
        assert not engine.dialect.has_table(conn, "stamps")
    db.upgrade(engine)
    db.check(engine)


def test_alembic_writes_to_the_current_stdout(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Alembic binds its default stdout when it is first imported; a stream closed since (a
    # test's capture, a daemon's redirected stdout) must not break `check` (CI failed on it).
    import alembic.config  # noqa: F401  (imported before sys.stdout changes)

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    db.check(engine)
    assert "No new upgrade operations detected." in out.getvalue()


def test_grouped_commits_and_durable_rows(engine: Engine) -> None:
    async def scenario() -> tuple[list[int], int]:
        journal = Journal(engine)
        journal.start()
        reqs = [TagRequest(f"{i:040x}", "t") if i % 2 else BranchRequest(f"{i:040x}", "a" * 40)
                for i in range(300)]
        ids = await asyncio.gather(*(journal.record(r, 1700000000 + i)
                                     for i, r in enumerate(reqs)))
        commits = journal.commits
        for i, sid in enumerate(ids[:10]):
            journal.signed(sid, "w1", 1 + i % 2, "b" * 40)
        await journal.stop()
        return list(ids), commits

    ids, commits = asyncio.run(scenario())
    assert len(set(ids)) == 300
    assert commits < 300 / 4  # grouped: far fewer transactions than requests
    assert count(engine) == 300
    with engine.connect() as conn:
        states = conn.execute(select(Stamp.state).where(Stamp.id.in_(ids[:10]))).scalars()
        assert set(states) == {StampState.SIGNED}
        attempts = conn.execute(select(Stamp.attempts).where(Stamp.id.in_(ids[:10]))
                                .order_by(Stamp.id)).scalars()
        assert list(attempts) == [1, 2] * 5
        pending = conn.execute(select(Stamp.attempts).where(Stamp.id.in_(ids[10:]))).scalars()
        assert set(pending) == {0}  # not yet handed to a worker
        first = conn.execute(select(Stamp.commit, Stamp.kind, Stamp.stamped_at)
                             .where(Stamp.id == ids[0])).one()
        assert tuple(first) == (f"{0:040x}", "branch", 1700000000)


def test_database_down_fails_request_without_signing(tmp_path: Path) -> None:
    """A journal that cannot write answers JournalError (503), never a stamp."""
    eng = db.make_engine(f"sqlite:///{tmp_path / 'j.sqlite3'}")
    db.upgrade(eng)
    with eng.begin() as conn:
        conn.execute(text("DROP TABLE stamps"))

    async def scenario() -> None:
        journal = Journal(eng)
        journal.start()
        with pytest.raises(JournalError):
            await journal.record(TagRequest("a" * 40, "t"), 1)
        await journal.stop()

    asyncio.run(scenario())
    eng.dispose()
