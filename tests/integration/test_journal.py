"""The journal on SQLite and PostgreSQL: durable before answered, grouped commits, migrations."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text, update

from server import db
from server.errors import JournalError
from server.models import Stamp, StampState
from server.stamping.journal import Journal
from server.stamping.requests import BranchRequest, DigestRequest, TagRequest


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'j.sqlite3'}"
    else:
        url = request.getfixturevalue("pg_url")
    eng = db.make_engine(url)
    db.upgrade(eng)
    yield eng  # (a PostgreSQL database of this test's own: dropped after it)
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


def test_a_failed_downgrade_changes_nothing(engine: Engine) -> None:
    """Revision 0002's downgrade refuses a journal with stamps that have no commit id; the
    revisions above it, already undone by then, are rolled back with it (SQLite as well)."""
    from alembic.util.exc import CommandError

    with engine.begin() as conn:
        conn.execute(text("INSERT INTO stamps (kind, algorithm, digest, stamped_at, state, "
                          "attempts) VALUES ('digest', 'sha256', :d, 1, 'pending', 0)"),
                     {"d": "ab" * 32})
    with pytest.raises(CommandError, match="holds 1 stamps without a commit id"):
        db.downgrade(engine, "0001")
    assert db.current_revision(engine) == db.SCHEMA_HEAD
    db.check(engine)
    assert count(engine) == 1


def test_schema_head_is_alembics_head(engine: Engine) -> None:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(db.alembic_config(engine)).get_current_head()
    assert head == db.SCHEMA_HEAD, "a new migration: set server.db.SCHEMA_HEAD to its revision"
    assert db.current_revision(engine) == head
    db.downgrade(engine, "base")
    assert db.current_revision(engine) is None
    db.upgrade(engine, "0008")
    assert db.current_revision(engine) == "0008"


def test_a_database_at_head_is_not_given_to_alembic(tmp_path: Path) -> None:
    # Start-up on a migrated database skips Alembic (its import alone is 0.3 s of CPU); one
    # a revision behind is upgraded.
    url = f"sqlite:///{tmp_path / 'h.sqlite3'}"
    program = (
        "import sys\n"
        "from server import db\n"
        f"engine = db.make_engine({url!r})\n"
        "db.upgrade(engine)\n"
        "print(db.current_revision(engine), 'alembic' in sys.modules)\n")
    for alembic_imported in ("True", "False"):  # migrated by the first start, not the second
        out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                             check=True, cwd=Path(__file__).parents[2]).stdout.split()
        assert out == [db.SCHEMA_HEAD, alembic_imported]
    engine = db.make_engine(url)
    try:
        db.downgrade(engine, "0008")
        db.upgrade(engine)
        assert db.current_revision(engine) == db.SCHEMA_HEAD
    finally:
        engine.dispose()


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


def test_an_orphaned_stamp_still_takes_its_outcome_and_no_other_state_does(
        engine: Engine) -> None:
    """A stamp the logs published as ``orphaned`` (pending too long) takes an outcome that is
    recorded after all, as a pending one does; a settled one keeps its state (an outcome
    applied twice, a failed stamp the log committer marked)."""
    settled = (StampState.SIGNED, StampState.FAILED_UNLOGGED)

    async def scenario() -> list[int]:
        journal = Journal(engine)
        journal.start()
        ids = list(await asyncio.gather(*(journal.record(DigestRequest("sha256", f"{i:064x}"),
                                                         1700000000) for i in range(4))))
        with engine.begin() as conn:
            for sid, state in zip(ids[1:], (StampState.ORPHANED, *settled), strict=True):
                conn.execute(update(Stamp).where(Stamp.id == sid).values(state=state))
        for sid in ids:
            await journal.signed_durably(sid, "w1", 1, f"receipt {sid}")
        await journal.stop()
        return ids

    ids = asyncio.run(scenario())
    with engine.connect() as conn:
        rows = {r.id: (r.state, r.receipt)
                for r in conn.execute(select(Stamp.id, Stamp.state, Stamp.receipt))}
    assert [rows[i] for i in ids] == [
        (StampState.SIGNED, f"receipt {ids[0]}"), (StampState.SIGNED, f"receipt {ids[1]}"),
        (StampState.SIGNED, None), (StampState.FAILED_UNLOGGED, None)]


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


@pytest.mark.postgres
def test_a_worker_host_refuses_a_database_behind_the_code(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from stampd.cli import EXIT_FAILED, main

    engine = db.make_engine(pg_url)  # (migrated, and this test's own)
    try:
        db.downgrade(engine, "0008")
        monkeypatch.setenv("STAMPD_DISPATCH", "database")
        assert main(["worker", "--database-url", pg_url, "--data-dir", str(tmp_path)]) \
            == EXIT_FAILED
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"at schema revision 0008, not {db.SCHEMA_HEAD}: run `stampd db upgrade`" in err
        assert db.current_revision(engine) == "0008"  # a worker host never migrates
    finally:
        engine.dispose()
