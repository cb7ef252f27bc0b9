"""The stamping path every front end shares, one for every kind of request: record the request
durably, then have a worker holding the chosen key sign its job, then record the outcome.

    request ──> Journal.record (committed) ──> Dispatcher.sign (a worker) ──> Journal.signed
                                 request.job(context)         request.outcome(context, job, text)

Where the host's coordinator keeps both the journal and the dispatcher (SQLite, several HTTP
processes) and the request's job does not name its serial (a tag or a branch stamp), the three
steps are one call to it (`RecordAndSign`): the job is built first, the coordinator commits
the row, has the job signed, journals the outcome, and answers once.

What differs between kinds (the job, the answer, whether the signed text is stored before the
answer goes out) is each request's own (`server.stamping.requests.Request`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from formats.jobs import GitJob, Job
from formats.keys import ServedKey
from formats.manifests import Text
from server.dispatch import Dispatcher, Signed
from server.errors import JournalError, MalformedAnswer, StampError, Unavailable
from server.stamping.journal import JournalApi
from server.stamping.requests import Request, StampContext

log = logging.getLogger(__name__)

# Seconds a failed stamp's answer waits for its outcome to be committed (see Stamper._failed).
FAILURE_WRITE_TIMEOUT = 5.0

A = TypeVar("A")


class RecordAndSign(Protocol):
    """Record a request and, once its row is committed, have ``job`` (a git object's) signed
    by a worker holding ``key`` and journal it signed with the signed object's id, in one
    call (`server.coordinator.CoordinatorLink`). The stamp id and the signature; else
    `JournalError` (nothing recorded), or the signing's `StampError` (the row recorded and
    its failure committed), `Unavailable` when no worker signed within ``timeout`` seconds
    of the commit."""

    async def record_and_sign(self, req: Request[Any, Any], t: int, key_id: str | None,
                              job: GitJob, key: str, timeout: float) -> tuple[int, Signed]: ...


class Stamper:
    def __init__(self, journal: JournalApi, dispatcher: Dispatcher, keys: Sequence[ServedKey], *,
                 public_url: str, request_timeout: float,
                 clock: Callable[[], float], at_once: RecordAndSign | None = None) -> None:
        self.journal = journal
        self.dispatcher = dispatcher
        self.at_once = at_once  # (where one call records and signs: `RecordAndSign`)
        self.keys = keys  # the primary key first
        self.public_url = public_url
        self.request_timeout = request_timeout
        self.clock = clock

    async def _sign(self, stamp_id: int, job: Job, key: ServedKey) -> Signed:
        try:
            async with asyncio.timeout(self.request_timeout):
                return await self.dispatcher.sign(job, key.id)
        except TimeoutError:
            await self._failed(stamp_id, "timed out")
            raise Unavailable("no worker could sign in time; retry later") from None
        except StampError as e:
            await self._failed(stamp_id, e.message)
            raise
        except Exception as e:
            await self._failed(stamp_id, f"{type(e).__name__}: {e}")
            raise

    async def _store(self, stamp_id: int, signed: Signed, text: str | tuple[Text, ...],
                     what: str) -> None:
        """Record a signed stamp with the signed text it answers (a manifest's in parts),
        committed before the answer goes out (so that a GET finds it from then on). A
        manifest's text is stored 1 MiB per group commit (`Journal`), within the same
        timeout."""
        try:
            async with asyncio.timeout(self.request_timeout):
                if isinstance(text, str):
                    await self.journal.signed_durably(stamp_id, signed.worker, signed.attempts,
                                                      text)
                else:
                    await self.journal.signed_manifest_durably(stamp_id, signed.worker,
                                                               signed.attempts, text)
        except TimeoutError:
            raise JournalError(f"the {what} could not be stored; retry later") from None

    async def _failed(self, stamp_id: int, error: str) -> None:
        """Record the failure, and wait until it is committed before the client is told.

        The log committer publishes a stamp left ``pending`` past the request timeout: its
        process died, perhaps after the signature went out. A stamp answered 503 whose outcome
        was still queued when the process died would be published too, though its client was
        told it failed (`bench.crash` found such stamps after kill -9). A signature never left
        for a failed stamp, so the wait costs only the 503's latency (one group commit). With
        the database down the wait is bounded; the 503 goes out anyway."""
        try:
            async with asyncio.timeout(FAILURE_WRITE_TIMEOUT):
                await self.journal.failed_durably(stamp_id, error)
        except TimeoutError:
            log.warning("failure of stamp %d not recorded within %.0f s", stamp_id,
                        FAILURE_WRITE_TIMEOUT, extra={"stamp_id": stamp_id})

    async def stamp(self, req: Request[Any, A], key: ServedKey | None = None) -> A:
        """The signed answer to ``req`` (a git tag or commit, a receipt and its statement, a
        manifest, an RFC 3161 token), signed with ``key`` (the primary key if none). The
        request is committed before it is signed; a receipt's or manifest's signed text is
        committed before it is returned."""
        key = key or self.keys[0]
        t = int(self.clock())
        key_id = None if key.primary else key.id
        if self.at_once is not None and req.serial_free:
            ctx = StampContext(time=t, serial=0, key=key, url=self.public_url)
            job = req.job(ctx)  # (serial free: built before the row has one)
            stamp_id, signed = await self.at_once.record_and_sign(req, t, key_id, job, key.id,
                                                                  self.request_timeout)
            # (journalled signed by the host: a tag's or branch's outcome is its object id)
            ctx = StampContext(time=t, serial=stamp_id, key=key, url=self.public_url)
            return req.outcome(ctx, job, signed.text).answer  # (not `replace`: 2 us more)
        stamp_id = await self.journal.record(req, t, key_id)
        ctx = StampContext(time=t, serial=stamp_id, key=key, url=self.public_url)
        job = req.job(ctx)
        signed = await self._sign(stamp_id, job, key)
        try:
            outcome = req.outcome(ctx, job, signed.text)
        except MalformedAnswer as e:
            await self._failed(stamp_id, f"malformed answer: {e.detail}")
            raise
        if outcome.stored is None:
            self.journal.signed(stamp_id, signed.worker, signed.attempts, outcome.object_id)
        else:
            await self._store(stamp_id, signed, outcome.stored, req.noun)
        return outcome.answer
