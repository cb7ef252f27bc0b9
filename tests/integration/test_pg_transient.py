"""PostgreSQL under contention: several API hosts write ``stamps`` and ``jobs`` at once.

Row locks are taken in one order (the journal's outcomes in ascending id order; the reaper's
rows in id order, skipping those held elsewhere), so concurrent group commits wait for each other
instead of deadlocking; and a transient error (deadlock 40P01, serialization failure 40001, a
lost connection) runs the transaction again a bounded number of times, never a group whose
inserts may already have committed. The deadlocks, serialization failures and lost connections
here are real ones, made by real PostgreSQL sessions; the interleavings are forced with row
locks held by the test and waits on ``pg_stat_activity`` (no sleeps, no timing asserts).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, Engine, event, func, insert, select, text
from sqlalchemy import exc as sa_exc

from server import db
from server.dispatch.database import DbDispatcher
from server.errors import JournalError
from server.leadership import AdvisoryLeader
from server.models import Stamp, StampState
from server.stamping.journal import Journal
from server.stamping.requests import TagRequest

APP = "stampd-transient-test"  # application_name of the connections under test


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    eng = db.make_engine(pg_url, connect_args={"application_name": APP})
    yield eng  # (pg_url: a migrated database of this test's own, dropped after it)
    eng.dispose()


@pytest.fixture
def admin(pg_url: str) -> Iterator[Engine]:
    """Connections of the test itself (blockers, observers), not counted as under test."""
    eng = db.make_engine(pg_url)
    yield eng
    eng.dispose()


def psycopg_url(engine: Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def seed(engine: Engine, n: int) -> list[int]:
    """``n`` pending stamps, ids ascending."""
    with engine.begin() as conn:
        ids = [conn.execute(insert(Stamp).values(
            kind="tag", commit=f"{i:040x}", tagname="t", stamped_at=1, state=StampState.PENDING,
            attempts=0).returning(Stamp.id)).scalar_one() for i in range(n)]
    assert ids == sorted(ids)
    return ids


def lock_waiters(admin: Engine) -> int:
    """Sessions of this database waiting for a lock (a row another transaction holds)."""
    with admin.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'")).scalar_one())


def wait_until(predicate: Callable[[], bool], what: str, bound: float = 60) -> None:
    deadline = time.monotonic() + bound  # a bound on the test, not an assertion on timing
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


class Runner(threading.Thread):
    """Runs ``fn`` in a thread; keeps its result or the exception it raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # handed to the test
            self.error = e

    def outcome(self) -> Any:
        self.join(120)
        assert not self.is_alive(), "the thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def journal_group(engine: Engine, commit: str, outcomes: list[int], worker: str
                  ) -> Callable[[], tuple[int, int]]:
    """One group commit of a journal of its own (as on one API host): a new request and the
    outcomes of ``outcomes``, in that order. Returns (the request's stamp id, retries)."""

    async def scenario() -> tuple[int, int]:
        journal = Journal(engine)
        journal.start()
        try:
            # All queued before the journal's task runs: one transaction.
            sid, *_ = await asyncio.gather(
                journal.record(TagRequest(commit, "t"), 2),
                *(journal.signed_durably(s, worker, 1, f"receipt {s}") for s in outcomes))
        finally:
            await journal.stop()
        return sid, journal.retries

    return lambda: asyncio.run(scenario())


def signed_by(engine: Engine, ids: list[int]) -> dict[int, tuple[str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(select(Stamp.id, Stamp.state, Stamp.worker)
                            .where(Stamp.id.in_(ids))).all()
    return {r.id: (r.state, r.worker) for r in rows}


def count_commit(engine: Engine, commit: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Stamp)
                                .where(Stamp.commit == commit)).scalar_one())


# -- lock order ----------------------------------------------------------------------------------

def test_two_journals_outcomes_in_opposite_orders_do_not_deadlock(engine: Engine,
                                                                 admin: Engine) -> None:
    """Two API hosts' group commits carry outcomes of the same stamps in opposite orders (x
    then y, y then x). Each is stopped after its first row (the test holds one row of each),
    then both go on: taking rows in arrival order, each holds what the other wants (a
    deadlock, and one host's requests answered 503); in id order, one waits for the other."""
    x, y, za, zb = seed(engine, 4)
    with admin.connect() as blocker:
        tx = blocker.begin()
        blocker.execute(text("SELECT id FROM stamps WHERE id IN (:a, :b) FOR UPDATE"),
                        {"a": za, "b": zb})
        hosts = [Runner(journal_group(engine, "a" * 40, [x, za, y], "host-a")),
                 Runner(journal_group(engine, "b" * 40, [y, zb, x], "host-b"))]
        for h in hosts:
            h.start()
        wait_until(lambda: lock_waiters(admin) == 2, "both group commits waiting for a lock")
        tx.commit()
    (sid_a, retries_a), (sid_b, retries_b) = [h.outcome() for h in hosts]
    assert count_commit(engine, "a" * 40) == count_commit(engine, "b" * 40) == 1
    rows = signed_by(engine, [x, y, za, zb])
    assert {state for state, _ in rows.values()} == {StampState.SIGNED}
    assert rows[za][1] == "host-a" and rows[zb][1] == "host-b"
    assert rows[x][1] == rows[y][1]  # the first to commit took both; the other found them done
    assert (retries_a, retries_b) == (0, 0)  # kept apart by the lock order, not by a retry
    assert sid_a != sid_b


# -- the journal runs a group again after a transient error -----------------------------------

def test_journal_group_chosen_as_deadlock_victim_is_run_again(engine: Engine,
                                                              admin: Engine) -> None:
    """Another transaction (as a log committer could) closes a lock cycle with a group commit,
    and PostgreSQL aborts the group (40P01). The group is run again: its request is recorded
    once, its outcomes applied, no error reaches the client."""
    x, w, y = seed(engine, 3)
    with admin.connect() as blocker, admin.connect() as other:
        btx = blocker.begin()
        blocker.execute(text("SELECT id FROM stamps WHERE id = :w FOR UPDATE"), {"w": w})
        otx = other.begin()
        # The other side waits long before it looks for deadlocks: the group, whose wait
        # closes the cycle, is the one PostgreSQL aborts.
        other.execute(text("SET LOCAL deadlock_timeout = '60s'"))
        other.execute(text("SELECT id FROM stamps WHERE id = :y FOR UPDATE"), {"y": y})
        group = Runner(journal_group(engine, "c" * 40, [x, w, y], "host-c"))
        group.start()
        wait_until(lambda: lock_waiters(admin) == 1, "the group holding x, waiting for w")

        def take_x() -> None:
            other.execute(text("SELECT id FROM stamps WHERE id = :x FOR UPDATE"), {"x": x})
            otx.commit()

        taker = Runner(take_x)
        taker.start()
        wait_until(lambda: lock_waiters(admin) == 2, "the other transaction waiting for x")
        btx.commit()  # the group takes w, then waits for y: a cycle
        taker.outcome()
        _sid, retries = group.outcome()
    assert retries >= 1
    assert count_commit(engine, "c" * 40) == 1
    assert signed_by(engine, [x, w, y]) == {i: (StampState.SIGNED, "host-c") for i in (x, w, y)}


def journal_backends(admin: Engine) -> list[int]:
    with admin.connect() as conn:
        return [int(p) for p in conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE application_name = :app "
            "AND datname = current_database()"), {"app": APP}).scalars()]


def terminate(admin: Engine, pids: list[int]) -> None:
    with admin.connect() as conn:
        for pid in pids:  # (the second argument: wait until it is gone, up to 10 s)
            conn.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})


def test_journal_survives_a_dropped_connection(engine: Engine, admin: Engine) -> None:
    """The journal's connection is killed between two group commits (a restarted server, a
    failover): the next group reconnects and is recorded; the request is not failed."""

    async def scenario() -> tuple[int, int, int]:
        journal = Journal(engine)
        journal.start()
        try:
            first = await journal.record(TagRequest("d" * 40, "t"), 1)
            pids = journal_backends(admin)
            assert pids, "the journal holds a connection"
            terminate(admin, pids)
            second = await journal.record(TagRequest("e" * 40, "t"), 1)
        finally:
            await journal.stop()
        return first, second, journal.retries

    first, second, retries = asyncio.run(scenario())
    assert second > first and retries >= 1
    assert count_commit(engine, "d" * 40) == count_commit(engine, "e" * 40) == 1


def test_group_with_requests_is_not_run_again_when_commit_is_lost(engine: Engine,
                                                                  admin: Engine) -> None:
    """A connection lost while COMMIT is under way leaves the outcome unknown: a group that
    inserts requests is not run again (it may have committed: a stamp would be recorded
    twice); its requests fail with 503. A group of outcomes alone is run again."""
    (sid,) = seed(engine, 1)
    armed = {"requests": True, "outcomes": True}

    def before_commit(conn: Connection) -> None:
        # (ConnectionEvents.commit: just before the driver's COMMIT)
        kind = "requests" if armed["requests"] else "outcomes" if armed["outcomes"] else None
        if kind is not None:
            armed[kind] = False
            terminate(admin, journal_backends(admin))

    event.listen(engine, "commit", before_commit)
    try:
        async def scenario() -> int:
            journal = Journal(engine)
            journal.start()
            try:
                with pytest.raises(JournalError):
                    await journal.record(TagRequest("f" * 40, "t"), 1)
                retries = journal.retries
                await journal.signed_durably(sid, "host-f", 1, "receipt")
            finally:
                await journal.stop()
            return journal.retries - retries

        outcome_retries = asyncio.run(scenario())
    finally:
        event.remove(engine, "commit", before_commit)
    assert count_commit(engine, "f" * 40) <= 1  # (0 here: the backend died before COMMIT)
    assert outcome_retries == 1
    assert signed_by(engine, [sid]) == {sid: (StampState.SIGNED, "host-f")}


# -- the retry helper, with real errors ----------------------------------------------------------

def real_deadlock(url: str) -> psycopg.Error:
    """Two sessions each holding a row the other wants: PostgreSQL aborts one (40P01)."""
    with psycopg.connect(url) as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS tr_rows (id int PRIMARY KEY)")
        setup.execute("INSERT INTO tr_rows VALUES (1), (2) ON CONFLICT DO NOTHING")
    with psycopg.connect(url) as a, psycopg.connect(url) as b:
        a.execute("SELECT 1 FROM tr_rows WHERE id = 1 FOR UPDATE")
        b.execute("SELECT 1 FROM tr_rows WHERE id = 2 FOR UPDATE")
        first = Runner(lambda: a.execute("SELECT 1 FROM tr_rows WHERE id = 2 FOR UPDATE"))
        first.start()
        with psycopg.connect(url, autocommit=True) as watch:
            wait_until(lambda: watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'").fetchone() == (1,), "a waiting for row 2")
        errors: list[BaseException] = []
        try:
            b.execute("SELECT 1 FROM tr_rows WHERE id = 1 FOR UPDATE")
        except psycopg.Error as e:
            errors.append(e)
            b.rollback()  # lets a go on
        first.join(120)
        if first.error is not None:
            errors.append(first.error)
            b.rollback()
    assert len(errors) == 1, errors
    assert isinstance(errors[0], psycopg.Error)
    return errors[0]


def real_serialization_failure(url: str) -> psycopg.Error:
    """A REPEATABLE READ transaction updates a row changed since its snapshot (40001)."""
    with psycopg.connect(url, autocommit=True) as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS tr_rows (id int PRIMARY KEY)")
        setup.execute("INSERT INTO tr_rows VALUES (1), (2) ON CONFLICT DO NOTHING")
    with psycopg.connect(url) as a, psycopg.connect(url, autocommit=True) as b:
        a.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        a.execute("SELECT * FROM tr_rows").fetchall()  # the snapshot
        b.execute("UPDATE tr_rows SET id = id WHERE id = 1")
        with pytest.raises(psycopg.Error) as caught:
            a.execute("UPDATE tr_rows SET id = id WHERE id = 1")
        return caught.value


def real_disconnect(url: str, admin_url: str) -> psycopg.Error:
    """A session whose backend was terminated (as by a restart or failover)."""
    with psycopg.connect(url, autocommit=True) as victim:
        pid = victim.info.backend_pid
        with psycopg.connect(admin_url, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
        with pytest.raises(psycopg.OperationalError) as caught:
            victim.execute("SELECT 1")
        return caught.value


def run_with(errors: list[BaseException], result: int = 7) -> tuple[Callable[[], int],
                                                                     list[int]]:
    """A run that raises ``errors`` in turn, then returns ``result``; and its call count."""
    calls = [0]

    def run() -> int:
        calls[0] += 1
        if calls[0] <= len(errors):
            raise errors[calls[0] - 1]
        return result

    return run, calls


def test_transient_errors_are_retried_a_bounded_number_of_times(engine: Engine,
                                                                admin: Engine) -> None:
    url, admin_url = psycopg_url(engine), psycopg_url(admin)
    deadlock = real_deadlock(url)
    serialization = real_serialization_failure(url)
    disconnect = real_disconnect(url, admin_url)
    assert (deadlock.sqlstate, serialization.sqlstate) == ("40P01", "40001")
    with psycopg.connect(url) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT * FROM no_such_table")
    other = caught.value  # 42P01: running it again cannot help
    # SQLAlchemy's wrapping of a lost connection, as the journal and dispatcher see it.
    with engine.connect() as conn:
        terminate(admin, [conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()])
        with pytest.raises(sa_exc.DBAPIError) as wrapped:
            conn.exec_driver_sql("SELECT 1")
    assert wrapped.value.connection_invalidated

    for e in (deadlock, serialization, disconnect, wrapped.value):
        assert db.is_transient(e), e
    assert db.is_disconnect(disconnect) and db.is_disconnect(wrapped.value)
    assert not db.is_disconnect(deadlock) and not db.is_transient(other)
    assert not db.is_transient(db.CommitUnknown("lost during COMMIT"))

    # Transient errors: run again until it succeeds, waiting a little (jittered) each time.
    sleeps: list[float] = []
    run, calls = run_with([deadlock, serialization, disconnect])
    assert db.retry_transient(run, what="test", sleep=sleeps.append) == 7
    assert calls == [4] and len(sleeps) == 3
    assert all(0 < s <= db.RETRY_CAP for s in sleeps)

    # At most `attempts` runs; then the last error is raised.
    sleeps.clear()
    run, calls = run_with([deadlock] * 10)
    with pytest.raises(psycopg.Error) as last:
        db.retry_transient(run, what="test", attempts=4, sleep=sleeps.append)
    assert last.value is deadlock and calls == [4] and len(sleeps) == 3

    # Anything else is raised at once.
    for error in (other, db.CommitUnknown("lost during COMMIT"), ValueError("a bug")):
        run, calls = run_with([error])
        with pytest.raises(type(error)):
            db.retry_transient(run, what="test", sleep=sleeps.append)
        assert calls == [1]


def test_run_transaction_runs_work_again_only_when_that_is_safe(engine: Engine,
                                                                admin: Engine) -> None:
    """A connection lost while COMMIT is under way: the work is run again only for an
    idempotent transaction; otherwise `CommitUnknown`."""
    runs: list[str] = []

    def lose_commit(conn: Connection) -> None:
        runs.append("ran")
        if len(runs) == 1:
            terminate(admin, [conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()])

    with pytest.raises(db.CommitUnknown):
        db.run_transaction(engine, lose_commit, what="test", sleep=lambda _s: None)
    assert runs == ["ran"]
    runs.clear()
    db.run_transaction(engine, lose_commit, what="test", idempotent=True, sleep=lambda _s: None)
    assert runs == ["ran", "ran"]


# -- the reaper never waits for a row lock -------------------------------------------------------

def test_reaper_skips_jobs_locked_elsewhere(pg_url: str, engine: Engine, admin: Engine) -> None:
    """A job row held by another transaction (another host's reaper, a worker storing its
    result) is left for the next run instead of waited for: reapers of several API hosts
    cannot deadlock. (Without SKIP LOCKED the reap waits for the lock: lock_timeout fails it.)"""
    now = time.time()
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO worker_heartbeats VALUES ('gone', 'primary', 1, :t, :t)"),
                     {"t": now - 60})
        ids = [conn.execute(text(
            "INSERT INTO jobs (key_id, payload, state, worker, claimed_at, attempts, "
            "created_at) VALUES ('primary', '{}', 'claimed', 'gone', :t, 1, :t) RETURNING id"),
            {"t": now}).scalar_one() for _ in range(3)]
    impatient = db.make_engine(pg_url, connect_args={"options": "-c lock_timeout=5000"})
    try:
        with admin.connect() as blocker:
            tx = blocker.begin()
            blocker.execute(text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"),
                            {"id": ids[1]})
            DbDispatcher(impatient, max_attempts=3, heartbeat_timeout=10).reap()
            tx.commit()
        with engine.connect() as conn:
            states = {r.id: r.state for r in conn.execute(text("SELECT id, state FROM jobs"))}
        assert states == {ids[0]: "queued", ids[1]: "claimed", ids[2]: "queued"}
        DbDispatcher(impatient, max_attempts=3, heartbeat_timeout=10).reap()
        with engine.connect() as conn:
            states = {r.id: r.state for r in conn.execute(text("SELECT id, state FROM jobs"))}
        assert set(states.values()) == {"queued"}
    finally:
        impatient.dispose()


# -- the log writer's lock ---------------------------------------------------------------------

def test_log_writer_lock_is_taken_again_after_a_dropped_connection(engine: Engine,
                                                                   admin: Engine) -> None:
    """The log lock lives on its connection: when that connection is killed, the next check
    connects again and takes the lock at once (no other host was quicker), instead of giving up
    the log for a whole commit interval."""
    first, second = AdvisoryLeader(psycopg_url(engine)), AdvisoryLeader(psycopg_url(engine))
    try:
        assert first() and not second()
        assert first.conn is not None
        terminate(admin, [first.conn.info.backend_pid])
        assert first()
        assert not second()
    finally:
        first.close()
        second.close()
