"""The state columns on SQLite and PostgreSQL: each holds one of its enum's values, and the
database refuses any other (migration 0010's CHECK constraints); the migration up and down
with rows in every table it changes."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import CheckConstraint, Connection, Engine, inspect, text
from sqlalchemy.exc import IntegrityError

from formats.jobs import JobState
from server import db
from server.models import Base, CrossStampState, LogCommitState, MailStampState, StampState
from tests.helpers import migrated_sqlite

BEFORE = "0009"  # the revision before the state checks

# Each state machine: its table, its enum, and how to insert a row of that table in a state.
MACHINES: dict[str, tuple[type[enum.StrEnum], str]] = {
    "stamps": (StampState,
               "INSERT INTO stamps (kind, algorithm, digest, stamped_at, attempts, state) "
               "VALUES ('digest', 'sha256', 'ab', 1, 0, :state)"),
    "log_commits": (LogCommitState,
                    "INSERT INTO log_commits (created_at, hash_count, state) "
                    "VALUES (1, 0, :state)"),
    "cross_stamps": (CrossStampState,
                     "INSERT INTO cross_stamps (peer, log_commit, attempts, next_attempt_at, "
                     "created_at, updated_at, state) VALUES ('p', :head, 0, 0, 1, 1, :state)"),
    "mail_stamps": (MailStampState,
                    "INSERT INTO mail_stamps (stamper, log_commit, attempts, refused, "
                    "next_attempt_at, created_at, updated_at, state) "
                    "VALUES ('p', :head, 0, 0, 0, 1, 1, :state)"),
    "jobs": (JobState,
             "INSERT INTO jobs (key_id, payload, attempts, created_at, state) "
             "VALUES ('primary', '{}', 0, 1, :state)"),
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = migrated_sqlite(tmp_path / "s.sqlite3")
    else:
        url = request.getfixturevalue("pg_url")  # (migrated, and this test's own)
    # One pooled connection: the migrations a test runs and its statements share it.
    eng = db.make_engine(url, pool_size=1, max_overflow=0)
    yield eng
    eng.dispose()


def insert(conn: Connection, table: str, state: str, n: int = 0) -> None:
    if table == "cross_stamps":
        conn.execute(text("INSERT INTO peers (name, url) VALUES ('p', 'u') "
                          "ON CONFLICT DO NOTHING"))
    conn.execute(text(MACHINES[table][1]), {"state": state, "head": f"h{n}"})


def states(engine: Engine, table: str) -> list[str]:
    with engine.connect() as conn:
        return [str(s) for s in conn.execute(text(f"SELECT state FROM {table} ORDER BY 1"))
                .scalars()]


@pytest.mark.parametrize("table", list(MACHINES))
def test_every_state_is_accepted_and_an_unknown_one_refused(engine: Engine, table: str
                                                            ) -> None:
    machine = MACHINES[table][0]
    with engine.begin() as conn:
        for n, state in enumerate(machine):
            insert(conn, table, state, n)
    assert states(engine, table) == sorted(s.value for s in machine)
    for bad in ("bogus", "", next(iter(machine)).value.upper(), next(iter(machine)) + " "):
        with pytest.raises(IntegrityError, match=f"ck_{table}_state"), engine.begin() as conn:
            insert(conn, table, bad, 99)
        with pytest.raises(IntegrityError, match=f"ck_{table}_state"), engine.begin() as conn:
            conn.execute(text(f"UPDATE {table} SET state = :s"), {"s": bad})
    assert states(engine, table) == sorted(s.value for s in machine)  # (nothing changed)


def test_the_schema_has_the_models_state_checks(engine: Engine) -> None:
    """`db check` (Alembic) does not compare CHECK constraints: this test does."""
    inspector = inspect(engine)
    for table in Base.metadata.sorted_tables:
        declared = {c.name for c in table.constraints if isinstance(c, CheckConstraint)}
        found = {c["name"] for c in inspector.get_check_constraints(table.name)}
        assert found == declared, table.name
        assert declared == ({f"ck_{table.name}_state"} if table.name in MACHINES else set())


def test_a_new_job_is_queued_by_the_tables_defaults(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (key_id, payload, created_at) "
                          "VALUES ('primary', '{}', 1)"))
        assert tuple(conn.execute(text("SELECT state, attempts FROM jobs")).one()) \
            == (JobState.QUEUED, 0)


@pytest.mark.postgres
def test_enqueue_inserts_a_queued_job(pg_url: str) -> None:
    from server.dispatch.database import execute
    from workers import jobtable

    engine = db.make_engine(pg_url)
    try:
        with engine.begin() as conn:
            job_id = execute(conn, jobtable.enqueue("primary", "{}", 5.0)).scalar_one()
            row = conn.execute(text("SELECT state, attempts, worker, created_at FROM jobs "
                                    "WHERE id = :id"), {"id": job_id}).one()
        assert tuple(row) == (JobState.QUEUED, 0, None, 5.0)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_worker_restarted_in_its_slot_is_seen_with_its_own_pid(pg_url: str) -> None:
    """A worker's name is its supervisor's and its slot's: the one restarted in a slot keeps
    the name, and its heartbeat replaces the pid and start time of the one before."""
    from server.dispatch.database import execute
    from workers import jobtable

    engine = db.make_engine(pg_url)
    try:
        with engine.begin() as conn:
            for pid, now in ((100, 1.0), (100, 2.0), (200, 3.0), (200, 4.0)):
                execute(conn, jobtable.heartbeat("host:1:0", "primary", pid, now))
                row = conn.execute(text("SELECT pid, started_at, last_seen FROM "
                                        "worker_heartbeats WHERE name = 'host:1:0'")).one()
                assert tuple(row) == (pid, 1.0 if pid == 100 else 3.0, now)
            alive = execute(conn, jobtable.live_workers(4.0)).all()
        assert [tuple(r) for r in alive] == [("host:1:0", "primary", 200)]
    finally:
        engine.dispose()


def seed_every_table(engine: Engine) -> None:
    """A row in every table the state checks' migration copies on SQLite, with the foreign
    keys between them: a manifest digest -> its stamp -> its log commit."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO log_commits (id, created_at, state, hash_count) "
                          "VALUES (1, 1, 'committed', 1)"))
        conn.execute(text("INSERT INTO stamps (id, kind, algorithm, digest, stamped_at, state, "
                          "attempts, log_commit_id) "
                          "VALUES (1, 'manifest', 'sha256', 'ab', 1, 'signed', 1, 1)"))
        conn.execute(text("INSERT INTO manifest_digests (stamp_id, bucket, algorithm, digests) "
                          "VALUES (1, 0, 'sha256', :d)"), {"d": b"\x01" * 32})
        insert(conn, "cross_stamps", "done")
        insert(conn, "jobs", "claimed")


def snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    with engine.connect() as conn:
        # (the columns every revision has: 0012 adds stamps.tlog_index)
        found = {t: [tuple(v for k, v in r._mapping.items() if k != "tlog_index")
                     for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY 1"))]
                 for t in ("log_commits", "stamps", "cross_stamps", "jobs")}
        # (the columns every revision has: 0011 keys the rows by prefix, not by bucket)
        found["manifest_digests"] = [tuple(r) for r in conn.execute(text(
            "SELECT stamp_id, algorithm, digests FROM manifest_digests ORDER BY 1"))]
        return found


def foreign_keys_enforced(engine: Engine) -> bool:
    """Does the database refuse a manifest digest of a stamp that is not there?"""
    key = ("bucket" if "bucket" in {c["name"] for c in inspect(engine).get_columns(
        "manifest_digests")} else "prefix")  # (0011 keys the rows by prefix)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO manifest_digests (stamp_id, {key}, algorithm, "
                              "digests) VALUES (999, :k, 'sha256', :d)"),
                         {"k": 0 if key == "bucket" else b"\0\0", "d": b""})
    except IntegrityError:
        return True
    return False


def test_state_checks_up_and_down_keep_every_row(engine: Engine) -> None:
    db.downgrade(engine, BEFORE)
    seed_every_table(engine)
    before = snapshot(engine)
    db.upgrade(engine)
    assert db.current_revision(engine) == db.SCHEMA_HEAD
    db.check(engine)
    assert snapshot(engine) == before
    assert foreign_keys_enforced(engine)  # (SQLite: on again after the migration)
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text("UPDATE stamps SET state = 'bogus'"))

    db.downgrade(engine, BEFORE)
    assert snapshot(engine) == before
    assert foreign_keys_enforced(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE stamps SET state = 'bogus'"))  # no check any more
        conn.execute(text("UPDATE stamps SET state = 'signed'"))
    # ... and no defaults: a job's state and attempts are spelled out again
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (key_id, payload, created_at) "
                          "VALUES ('primary', '{}', 1)"))
    db.upgrade(engine)
    assert snapshot(engine) == before


def test_a_row_in_an_unknown_state_stops_the_migration(engine: Engine) -> None:
    """A journal holding a state this release does not know is not migrated: the upgrade
    fails and leaves the schema (and the row) as they were."""
    db.downgrade(engine, BEFORE)
    seed_every_table(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE log_commits SET state = 'published'"))
    with pytest.raises(IntegrityError):
        db.upgrade(engine)
    assert db.current_revision(engine) == BEFORE
    assert states(engine, "log_commits") == ["published"]
    assert foreign_keys_enforced(engine)


def test_orphaned_stamps_are_pending_below_revision_0014(engine: Engine) -> None:
    """0014 adds the state ``orphaned``; a downgrade makes such stamps ``pending`` again (what
    the older release shows for them), and refuses no other row."""
    with engine.begin() as conn:
        for state in (StampState.ORPHANED, StampState.SIGNED):
            insert(conn, "stamps", state)
    db.downgrade(engine, "0013")
    assert states(engine, "stamps") == ["pending", "signed"]
    with pytest.raises(IntegrityError, match="ck_stamps_state"), engine.begin() as conn:
        insert(conn, "stamps", StampState.ORPHANED)
    db.upgrade(engine)
    assert db.current_revision(engine) == db.SCHEMA_HEAD
    with engine.begin() as conn:
        insert(conn, "stamps", StampState.ORPHANED)
    assert states(engine, "stamps") == ["orphaned", "pending", "signed"]
