"""The serve loops of a worker whose key is loaded: jobs from the host's dispatcher's socket
(`serve`) or claimed from the database's ``jobs`` table (`serve_db`), each batch signed by the
worker's `Signer` (`sign_many`, `sign`). Between jobs a waiting worker checks that its agent
and its supervisor are still there (`idle_check`); a loop returns the worker's exit status
(`workers.status`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from formats.frames import decode_frame
from formats.jobs import Job, MalformedMessage, ManifestJob, Result, job_from_dict
from procs import memory
from workers import jobtable
from workers.agents.gpg import GpgAgent
from workers.agents.ssh import SshAgent
from workers.errors import AgentError
from workers.link import DispatcherLink
from workers.signer import REFUSED, Signer
from workers.status import EXIT_AGENT_DIED, EXIT_NO_DISPATCHER

log = logging.getLogger(__name__)


def idle_check(agent: GpgAgent | SshAgent, parent: int, name: str) -> int | None:
    """The exit status a waiting worker must exit with: its agent died, or its supervisor
    (whose child it is) is gone. None: carry on."""
    if not agent.running:
        log.error("worker %s: agent %s is gone", name, agent.pid)
        return EXIT_AGENT_DIED
    if os.getppid() != parent:
        log.error("worker %s: supervisor is gone", name)
        return EXIT_NO_DISPATCHER
    return None


def sign_many(signer: Signer, messages: Sequence[dict[str, Any]]) -> list[Result]:
    """The answers to several job frames (`sign` for each), their git objects signed in one
    agent round trip where the signer can (`Signer.build_many`)."""
    ids: list[int] = []
    jobs: list[Job] = []
    answers: list[Result | None] = []
    for data in messages:
        job_id = data.get("id")
        answers.append(None)
        ids.append(int(job_id) if isinstance(job_id, int) else 0)
        try:
            jobs.append(job_from_dict(data))
        except REFUSED as e:
            answers[-1] = Result(ids[-1], error=f"malformed job: {e!r}")
    built = iter(signer.build_many(jobs))
    out = []
    for job_id, answer in zip(ids, answers, strict=True):
        if answer is None:
            b = next(built)
            answer = Result(job_id, error=f"malformed job: {b!r}") if isinstance(b, Exception) \
                else Result(job_id, object=b)
        out.append(answer)
    return out


def sign(signer: Signer, job_id: int | None, data: dict[str, Any]) -> Result:
    """The answer to one job: the signed object, or a refusal of a malformed job. An agent
    failure propagates (the worker exits, and the job goes to another worker)."""
    try:
        return Result(int(job_id or 0), object=signer.build(job_from_dict(data)))
    except REFUSED as e:
        return Result(int(job_id or 0), error=f"malformed job: {e!r}")


def serve(link: DispatcherLink, signer: Signer, agent: GpgAgent | SshAgent, name: str,
          parent: int | None = None) -> int:
    """Sign the jobs that come over ``link``. ``parent``: the supervisor's PID (default: our
    parent's now)."""
    parent = os.getppid() if parent is None else parent
    alone_since: float | None = None  # when the dispatcher went
    while True:
        messages = link.next_jobs(1.0)
        if messages is None:
            if link.connected:
                alone_since = None
            elif alone_since is None:
                alone_since = time.monotonic()
            elif time.monotonic() - alone_since > link.ALONE_FOR:
                log.warning("worker %s: no dispatcher", name)
                return EXIT_NO_DISPATCHER
            else:
                time.sleep(link.RETRY)
            code = idle_check(agent, parent, name)
            if code is not None:
                return code
            continue
        large = any(m.get("op") == ManifestJob.op for m in messages)
        try:
            replies = sign_many(signer, messages)
        except AgentError as e:
            log.error("worker %s: signing failed (%s); exiting so that another worker signs",
                      name, " ".join(str(e).split()))
            return EXIT_AGENT_DIED
        link.answer(b"".join(reply.frame() for reply in replies))
        if large:  # what held the manifest is free: give its pages back to the system
            del messages, replies
            memory.trim()


def serve_db(dsn: str, signer: Signer, agent: GpgAgent | SshAgent, name: str, key_id: str,
             beat_every: float = 2.0, parent: int | None = None) -> int:
    """The worker loop of database dispatch: claim, sign, record, notify (`workers.jobtable`).
    ``parent`` as for `serve`."""
    import psycopg

    parent = os.getppid() if parent is None else parent
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(jobtable.LISTEN_JOBS)
        # A job queued while we work is announced during one of our own statements. Without
        # a handler psycopg keeps every such notification until we next wait (under steady
        # load: never, so the worker's memory grows with every job); the handler only notes
        # that one came, so that we look for that job before waiting.
        woken = [False]

        def note(_n: psycopg.Notify) -> None:
            woken[0] = True

        conn.add_notify_handler(note)
        last_beat = 0.0
        try:
            while True:
                now = time.time()
                if now - last_beat >= beat_every:
                    conn.execute(*jobtable.heartbeat(name, key_id, os.getpid(), now))
                    last_beat = now
                row = conn.execute(*jobtable.claim(name, key_id, now)).fetchone()
                if row is not None:
                    job_id, payload = row
                    try:
                        answer = sign(signer, job_id, decode_frame(payload.encode()))
                    except AgentError as e:
                        log.error("worker %s: signing failed (%s); exiting (the job is "
                                  "requeued once our heartbeat stops)", name,
                                  " ".join(str(e).split()))
                        return EXIT_AGENT_DIED
                    except MalformedMessage as e:
                        answer = Result(job_id, error=f"malformed job: {e!r}")
                    stored = conn.execute(*jobtable.store(job_id, name, answer.object,
                                                          answer.error))
                    if stored.rowcount == 1:
                        conn.execute(*jobtable.notify_done(job_id))
                    else:  # taken over meanwhile: this signature is never issued
                        log.warning("worker %s: job %s was taken over; result dropped",
                                    name, job_id)
                    continue
                if woken[0]:  # a job was announced while we claimed: look again
                    woken[0] = False
                    continue
                for _ in conn.notifies(timeout=1.0, stop_after=1):
                    pass
                woken[0] = False  # (the handler hears the ones notifies() gave too)
                code = idle_check(agent, parent, name)
                if code is not None:
                    return code
        finally:
            with contextlib.suppress(Exception):
                conn.execute(*jobtable.forget_worker(name))
