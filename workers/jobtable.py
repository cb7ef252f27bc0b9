"""The ``jobs`` and ``worker_heartbeats`` tables of database dispatch: every statement on them,
the states of a job and the notification channels, in one place.

``STAMPD_DISPATCH=database`` (several hosts sharing one PostgreSQL): an API host enqueues a job
(`enqueue`, then `notify_queued`); a worker claims the oldest queued job of its key with
``FOR UPDATE SKIP LOCKED`` (`claim`), signs it, stores the result only while it still owns the
claim (`store`) and announces it (`notify_done`); the API host that waits for it reads it back
(`finished`). Workers send heartbeats (`heartbeat`, `forget_worker`); the reaper of every API
host sees which workers are alive (`live_workers`), puts the claims of dead or late workers back
in the queue or fails them after too many attempts (`reap`), and forgets long-dead workers
(`prune_heartbeats`).

A job moves ``queued -> claimed -> done | failed``; the reaper moves ``claimed`` back to
``queued`` (or to ``failed``). The states are `JobState`'s values, bound as parameters, never
spelled in the SQL. Every statement is an `Sql`: text in psycopg's ``%(name)s`` style and its
parameters, for ``psycopg.Connection.execute(*sql)`` (workers) or SQLAlchemy's
``Connection.exec_driver_sql(*sql)`` (the API side). Both sides use psycopg 3, so the text and
the parameter adaptation are the same. The schema itself, indexes, defaults and the CHECK
constraint on ``jobs.state`` (`JobState`'s values) included, is ``server.models`` (``Job``,
``WorkerHeartbeat``) and its migrations; this module only queries it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from formats.jobs import JobState

JOBS_CHANNEL = "stampd_jobs"  # NOTIFY: a job was queued (or requeued); payload empty
DONE_CHANNEL = "stampd_done"  # NOTIFY: a job is done or failed; payload its id
LISTEN_JOBS = f"LISTEN {JOBS_CHANNEL}"  # (LISTEN takes no parameters)
LISTEN_DONE = f"LISTEN {DONE_CHANNEL}"
GAVE_UP = "signing failed too often"  # the error of a job the reaper failed


# The states as bind parameters: %(queued)s, %(claimed)s, %(done)s, %(failed)s.
_STATES: dict[str, str] = {s.name.lower(): s.value for s in JobState}


class Sql(NamedTuple):
    """One statement (psycopg's ``%(name)s`` placeholders) and its parameters."""

    text: str
    params: dict[str, Any]


def _sql(text: str, **params: Any) -> Sql:
    used = {name: value for name, value in _STATES.items() if f"%({name})s" in text}
    return Sql(text, {**used, **params})


def _notify(channel: str, payload: str) -> Sql:
    # pg_notify() is NOTIFY with parameters; both are delivered when the transaction commits.
    return _sql("SELECT pg_notify(%(channel)s, %(payload)s)", channel=channel, payload=payload)


# -- the API side ----------------------------------------------------------------------------

def enqueue(key_id: str, payload: str, now: float) -> Sql:
    """Insert a job for a worker holding ``key_id``; returns its ``id``. It is queued, never
    claimed yet: the table's defaults (``server.models.Job``). Follow it with `notify_queued`
    in the same transaction."""
    return _sql(
        "INSERT INTO jobs (key_id, payload, created_at) "
        "VALUES (%(key_id)s, %(payload)s, %(now)s) RETURNING id",
        key_id=key_id, payload=payload, now=now)


def notify_queued() -> Sql:
    """Wake the workers waiting on `LISTEN_JOBS`."""
    return _notify(JOBS_CHANNEL, "")


def finished(ids: list[int]) -> Sql:
    """Those of ``ids`` that are done or failed: ``id, state, result, worker, error,
    attempts`` (``attempts``: how many times the job was claimed)."""
    return _sql(
        "SELECT id, state, result, worker, error, attempts FROM jobs "
        "WHERE id = ANY(%(ids)s) AND state IN (%(done)s, %(failed)s)", ids=list(ids))


def live_workers(seen_since: float) -> Sql:
    """``name, key_id, pid`` of the workers with a heartbeat at or after ``seen_since``."""
    return _sql("SELECT name, key_id, pid FROM worker_heartbeats WHERE last_seen >= %(since)s",
                since=seen_since)


def reap(max_attempts: int, claimed_before: float, seen_since: float) -> Sql:
    """Take back the claims older than ``claimed_before`` and those of workers without a
    heartbeat since ``seen_since``: back to the queue while the job has been claimed fewer than
    ``max_attempts`` times, else failed (`GAVE_UP`). Returns ``id, state`` of each job taken
    back.

    The rows are locked in ``id`` order and those another transaction holds are skipped
    (``FOR UPDATE SKIP LOCKED``): the reapers of several API hosts run at once, and a
    statement that never waits for a row lock cannot deadlock. A skipped job is either being
    stored by its worker or taken back by another reaper; if it is still a late claim, the
    next run takes it."""
    return _sql(
        "WITH taken AS MATERIALIZED (SELECT id FROM jobs WHERE state = %(claimed)s "
        "AND (claimed_at < %(late)s "
        "OR worker NOT IN (SELECT name FROM worker_heartbeats WHERE last_seen >= %(since)s)) "
        "ORDER BY id FOR UPDATE SKIP LOCKED) "
        "UPDATE jobs SET "
        "state = CASE WHEN attempts < %(max)s THEN %(queued)s ELSE %(failed)s END, "
        "worker = CASE WHEN attempts < %(max)s THEN NULL ELSE worker END, "
        "claimed_at = CASE WHEN attempts < %(max)s THEN NULL ELSE claimed_at END, "
        "error = CASE WHEN attempts < %(max)s THEN error ELSE %(gave_up)s END "
        "FROM taken WHERE jobs.id = taken.id "
        "RETURNING jobs.id, jobs.state",
        max=max_attempts, gave_up=GAVE_UP, late=claimed_before, since=seen_since)


def prune_heartbeats(seen_before: float) -> Sql:
    """Forget the workers not seen since ``seen_before`` (rows locked in name order, those
    held elsewhere skipped, as in `reap`)."""
    return _sql(
        "WITH gone AS MATERIALIZED (SELECT name FROM worker_heartbeats "
        "WHERE last_seen < %(before)s ORDER BY name FOR UPDATE SKIP LOCKED) "
        "DELETE FROM worker_heartbeats USING gone WHERE worker_heartbeats.name = gone.name",
        before=seen_before)


def prune_finished(created_before: float) -> Sql:
    """Delete the done and failed jobs queued before ``created_before``: their requests have
    been answered (or have timed out) long since. Without it the table, and its claim index
    full of dead ``queued`` entries, grows with every stamp and claims slow down. Rows are
    locked in ``id`` order and those held elsewhere skipped, as in `reap`."""
    return _sql(
        "WITH old AS MATERIALIZED (SELECT id FROM jobs WHERE state IN (%(done)s, %(failed)s) "
        "AND created_at < %(before)s ORDER BY id FOR UPDATE SKIP LOCKED) "
        "DELETE FROM jobs USING old WHERE jobs.id = old.id", before=created_before)


# -- the worker side -------------------------------------------------------------------------

def claim(worker: str, key_id: str, now: float) -> Sql:
    """Claim the oldest queued job of ``key_id`` that no other worker is claiming (``FOR UPDATE
    SKIP LOCKED``), counting the attempt; returns ``id, payload``, or no row."""
    return _sql(
        "UPDATE jobs SET state = %(claimed)s, worker = %(worker)s, claimed_at = %(now)s, "
        "attempts = attempts + 1 WHERE id = (SELECT id FROM jobs WHERE state = %(queued)s "
        "AND key_id = %(key_id)s ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) "
        "RETURNING id, payload",
        worker=worker, key_id=key_id, now=now)


def store(job_id: int, worker: str, result: str | None, error: str | None) -> Sql:
    """Record the answer to a job (done with ``result``, else failed with ``error``), only if
    ``worker`` still owns the claim: a row count of 0 means the job was taken back meanwhile
    and the answer must be dropped."""
    state = JobState.DONE if result is not None else JobState.FAILED
    return _sql(
        "UPDATE jobs SET state = %(state)s, result = %(result)s, error = %(error)s "
        "WHERE id = %(id)s AND worker = %(worker)s AND state = %(claimed)s",
        state=state.value, result=result, error=error, id=job_id, worker=worker)


def notify_done(job_id: int) -> Sql:
    """Wake the API hosts waiting on `LISTEN_DONE` for ``job_id``."""
    return _notify(DONE_CHANNEL, str(job_id))


def heartbeat(worker: str, key_id: str, pid: int, now: float) -> Sql:
    """Say that ``worker`` (serving ``key_id``, process ``pid``) is alive. A worker's name is
    its supervisor's and its slot's: a worker restarted in its slot has the name of the one
    before, and its own pid and start time replace that one's."""
    return _sql(
        "INSERT INTO worker_heartbeats (name, key_id, pid, started_at, last_seen) "
        "VALUES (%(worker)s, %(key_id)s, %(pid)s, %(now)s, %(now)s) "
        "ON CONFLICT (name) DO UPDATE SET last_seen = EXCLUDED.last_seen, "
        "key_id = EXCLUDED.key_id, pid = EXCLUDED.pid, started_at = CASE "
        "WHEN worker_heartbeats.pid = EXCLUDED.pid THEN worker_heartbeats.started_at "
        "ELSE EXCLUDED.started_at END",
        worker=worker, key_id=key_id, pid=pid, now=now)


def forget_worker(worker: str) -> Sql:
    """Remove the heartbeat of a worker that stops."""
    return _sql("DELETE FROM worker_heartbeats WHERE name = %(worker)s", worker=worker)
