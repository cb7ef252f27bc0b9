"""The journal on SQLite and PostgreSQL: durable before answered, grouped commits, migrations."""

from __future__ import annotations

import asyncio
import io
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text, update

from formats.manifests import key_prefix, parse_body
from server import db
from server.errors import JournalError
from server.models import ManifestDigests, ManifestText, Stamp, StampState
from server.stamping import journal as journal_module
from server.stamping import journal_writers
from server.stamping.journal import Journal, stamp_row
from server.stamping.requests import BranchRequest, DigestRequest, ManifestRequest, TagRequest
from tests.helpers import migrated_sqlite


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = migrated_sqlite(tmp_path / "j.sqlite3")
    else:
        url = request.getfixturevalue("pg_url")  # (migrated, and this test's own)
    eng = db.make_engine(url)
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


def test_writes_along_go_into_group_commits_all_or_none(engine: Engine) -> None:
    """Another writer's statements (`server.db.Writes`) go into the group commits, one set a
    commit, in order: kept when they change the rows they say, else rolled back to before
    them, and the group's own rows are committed either way."""
    p = "?" if engine.dialect.paramstyle == "qmark" else "%s"
    mark = f"UPDATE stamps SET worker = {p} WHERE id = {p} AND state = 'pending'"

    async def scenario() -> tuple[list[int], list[bool]]:
        journal = Journal(engine)
        journal.start()
        ids = list(await asyncio.gather(*(journal.record(DigestRequest("sha256", f"{i:064x}"),
                                                         1700000000) for i in range(3))))
        commits = journal.commits
        kept = [journal.write_along(db.Writes(((mark, ("kept", ids[0])),
                                               (mark, ("kept", ids[1]))), 2)),
                # (the third stamp is not signed: one row changed, not two)
                journal.write_along(db.Writes(((mark, ("lost", ids[2])),
                                               (mark.replace("pending", "signed"),
                                                ("lost", ids[2]))), 2))]
        late = journal.record_row_nowait(stamp_row(DigestRequest("sha256", "f" * 64),
                                                   1700000001))
        results = list(await asyncio.gather(*kept))
        ids.append(await late)
        assert journal.commits == commits + 2  # (the stamp's with the first, then the other)
        await journal.stop()
        return ids, results

    ids, kept = asyncio.run(scenario())
    assert kept == [True, False]
    with engine.connect() as conn:
        workers = {r.id: r.worker for r in conn.execute(select(Stamp.id, Stamp.worker))}
    assert [workers[i] for i in ids] == ["kept", "kept", None, None]


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


# -- what is too big for one group commit: a slice per commit --------------------------------

def stored_text(engine: Engine, sid: int) -> bytes:
    with engine.connect() as conn:
        return b"".join(bytes(p) for p in conn.execute(
            select(ManifestText.piece).where(ManifestText.stamp_id == sid)
            .order_by(ManifestText.seq)).scalars())


def test_a_manifest_is_indexed_and_stored_a_slice_per_commit_while_stamps_go_on(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manifest's digest index and its signed text are written a slice per group commit
    (`BULK_BYTES`, made small here): its id comes once every index row is committed, its
    outcome with the last piece of its text; a stamp recorded meanwhile is committed with the
    next slice, not behind the whole text (a 127 MiB text in one transaction made every stamp
    wait for it)."""
    monkeypatch.setattr(journal_module, "BULK_BYTES", 16 << 10)
    monkeypatch.setattr(journal_module, "PIECE", 4096)
    lines = "".join(f"{i:064x}  f{i}\n" for i in range(5000))
    req = ManifestRequest(parse_body(lines.encode()))
    parts = ("head\n", "\u00e9t\u00e9 " * 3000 + "\n" + lines, "sig\n")  # (not ASCII)

    async def scenario() -> tuple[int, int, int, int]:
        journal = Journal(engine)
        journal.start()
        sid = await journal.record(req, 1700000000)
        with engine.connect() as conn:  # every index row is in when the id comes
            indexed = conn.execute(select(func.count()).select_from(ManifestDigests)
                                   .where(ManifestDigests.stamp_id == sid)).scalar_one()
        assert indexed == len(req.digest_buckets())
        before = journal.commits
        text = journal.signed_manifest_durably_nowait(sid, "w1", 2, parts)
        stamp = await journal.record(DigestRequest("sha256", "ab" * 32), 1700000001)
        assert not text.done()  # (committed with the text's first slice)
        await text
        commits = journal.commits - before
        await journal.stop()
        return sid, stamp, before, commits

    sid, stamp, before, commits = asyncio.run(scenario())
    assert before > 5  # the row, then its index rows in slices
    assert commits > 5  # the text in slices
    assert stored_text(engine, sid) == "".join(parts).encode()
    with engine.connect() as conn:
        row = conn.execute(select(Stamp.state, Stamp.worker, Stamp.attempts, Stamp.receipt)
                           .where(Stamp.id == sid)).one()
        assert tuple(row) == (StampState.SIGNED, "w1", 2, None)
        got = conn.execute(select(ManifestDigests.prefix, ManifestDigests.digests)
                           .where(ManifestDigests.stamp_id == sid)).all()
        assert conn.execute(select(Stamp.state).where(Stamp.id == stamp)).scalar_one() \
            == StampState.PENDING
    assert sorted((bytes(p), bytes(d)) for p, d in got) == sorted(
        (key_prefix(k), d) for k, d in req.digest_buckets())


def test_a_stamp_waits_for_at_most_one_slice_besides_its_own_commit(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a manifest's index and text are written a slice per commit, a commit that a stamp
    waits for carries no slice unless the one before it carried none: a stamp waits for the
    slice being committed when it came, not for one more in its own commit; and the slices
    still go into every other commit at least, however many stamps come."""
    monkeypatch.setattr(journal_module, "BULK_BYTES", 16 << 10)
    monkeypatch.setattr(journal_module, "PIECE", 4096)
    lines = "".join(f"{i:064x}  f{i}\n" for i in range(5000))
    req = ManifestRequest(parse_body(lines.encode()))
    commits: list[tuple[int, bool]] = []  # each commit: its new rows, whether it took a slice

    async def scenario() -> None:
        journal = Journal(engine)
        write = journal._write

        def counted(rows: list[dict[str, Any]], updates: list[dict[str, Any]],
                    bulk: Sequence[Any] = (), along: Sequence[Any] = ()) -> Any:
            commits.append((len(rows), bool(bulk)))
            return write(rows, updates, bulk, along)

        journal._write = counted  # type: ignore[method-assign]
        journal.start()
        sid = await journal.record(req, 1700000000)
        text = journal.signed_manifest_durably_nowait(sid, "w1", 1, ("head\n", lines))
        n = 0
        while not text.done():
            await journal.record(DigestRequest("sha256", f"{n:064x}"), 1700000001)
            n += 1
        await journal.stop()

    asyncio.run(scenario())
    took = [slice_ for _rows, slice_ in commits]
    first, last = took.index(True), len(took) - 1 - took[::-1].index(True)
    stamped = [i for i, (rows, _) in enumerate(commits) if rows and first < i <= last]
    assert len(stamped) > 5  # (stamps were recorded while the slices were written)
    for i in stamped:
        assert not took[i] or not took[i - 1], commits
    for i in range(first, last):  # no two commits in a row without a slice
        assert took[i] or took[i + 1], commits


def test_manifest_texts_move_into_pieces_and_back(engine: Engine) -> None:
    """Revision 0015 moves each signed manifest's text from ``stamps.receipt`` into pieces of
    1 Mi characters (their UTF-8 concatenation is the text), and back down."""
    signed = "\u00e9" * (1 << 20) + "x" * ((1 << 20) + 5) + "\n"  # 3 pieces, one of 2 MiB
    db.downgrade(engine, "0014")
    with engine.begin() as conn:
        for receipt in (signed, "a receipt\n"):
            conn.execute(text("INSERT INTO stamps (kind, stamped_at, state, attempts, receipt) "
                              "VALUES (:k, 1, 'signed', 1, :r)"),
                         {"k": "manifest" if receipt is signed else "digest", "r": receipt})
        ids = [int(i) for i in conn.execute(text("SELECT id FROM stamps ORDER BY id")).scalars()]
    db.upgrade(engine)
    assert stored_text(engine, ids[0]) == signed.encode()
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ManifestText)).scalar_one() == 3
        receipts = dict(conn.execute(select(Stamp.id, Stamp.receipt)).all())
    assert receipts == {ids[0]: None, ids[1]: "a receipt\n"}
    db.downgrade(engine, "0014")
    with engine.connect() as conn:
        assert dict(conn.execute(text("SELECT id, receipt FROM stamps")).all()) == {
            ids[0]: signed, ids[1]: "a receipt\n"}


def _rows_in_main_file(path: Path) -> int:
    """Stamps in the database file itself, not counting the WAL (``immutable``: SQLite then
    reads the file alone): what a checkpoint has copied there."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM stamps").fetchone()[0])
    finally:
        conn.close()


def test_the_sqlite_journal_checkpoints_beside_its_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal's writer makes no checkpoint in a commit (one that did waited tens of ms
    more, and the stamps behind it as long); a thread of its own copies the WAL into the
    database file after commits."""
    monkeypatch.setattr(journal_writers, "CHECKPOINT_EVERY", 0.01)
    path = tmp_path / "j.sqlite3"
    eng = db.make_engine(f"sqlite:///{path}")
    db.upgrade(eng)
    eng.dispose()

    async def scenario() -> tuple[int, int]:
        journal = Journal(eng)
        journal.start()
        try:
            await asyncio.gather(*(journal.record(TagRequest(f"{i:040x}", "t"), 1700000000)
                                   for i in range(50)))
            writer = journal._writer
            assert isinstance(writer.conn, sqlite3.Connection)
            autocheckpoint = writer.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
            for _ in range(1000):  # at most 10 s
                if _rows_in_main_file(path) == 50:
                    break
                await asyncio.sleep(0.01)
            return autocheckpoint, _rows_in_main_file(path)
        finally:
            await journal.stop()

    assert asyncio.run(scenario()) == (0, 50)
