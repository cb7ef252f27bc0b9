"""The stamping path every front end shares: record the request durably, then have a worker
holding the chosen key sign it, then record the outcome.

    request ──> Journal.record (committed) ──> Dispatcher.sign (a worker) ──> Journal.signed
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Sequence

from formats.jobs import Job
from formats.receipts import Statement
from server.dispatch import Dispatcher, Signed
from server.errors import JournalError, SigningFailed, StampError, Unavailable
from server.stamping.journal import Journal
from server.stamping.requests import (
    DigestRequest,
    GitRequest,
    ManifestRequest,
    Request,
    TimestampRequest,
)
from workers.keys.keyset import ServedKey

log = logging.getLogger(__name__)

# Seconds a failed stamp's answer waits for its outcome to be committed (see Stamper._failed).
FAILURE_WRITE_TIMEOUT = 5.0


class Stamper:
    def __init__(self, journal: Journal, dispatcher: Dispatcher, keys: Sequence[ServedKey], *,
                 public_url: str, request_timeout: float,
                 clock: Callable[[], float]) -> None:
        self.journal = journal
        self.dispatcher = dispatcher
        self.keys = keys  # the primary key first
        self.public_url = public_url
        self.request_timeout = request_timeout
        self.clock = clock

    async def _record(self, req: Request, key: ServedKey) -> tuple[int, int]:
        t = int(self.clock())
        return await self.journal.record(req, t, None if key.primary else key.id), t

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

    async def _store(self, stamp_id: int, signed: Signed, text: str, what: str) -> None:
        """Record a signed stamp with the signed text it answers, committed before the answer
        goes out (so that a GET finds it from then on)."""
        try:
            async with asyncio.timeout(self.request_timeout):
                await self.journal.signed_durably(stamp_id, signed.worker, signed.attempts, text)
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

    async def stamp(self, req: GitRequest, key: ServedKey | None = None) -> str:
        """A signed git tag or commit for a Zeitgitter request."""
        key = key or self.keys[0]
        stamp_id, t = await self._record(req, key)
        uid = None if key.format == "openpgp" else key.uid
        job = req.job(t, self.public_url, uid)
        signed = await self._sign(stamp_id, job, key)
        self.journal.signed(stamp_id, signed.worker, signed.attempts,
                            job.object_id(signed.text.encode("ascii")))
        return signed.text

    async def receipt(self, req: DigestRequest, key: ServedKey | None = None
                      ) -> tuple[Statement, str]:
        """A signed receipt for a digest; returned once the receipt itself is stored."""
        key = key or self.keys[0]
        stamp_id, t = await self._record(req, key)
        statement = Statement(algorithm=req.algorithm, digest=req.digest, time=t,
                              server=self.public_url, serial=stamp_id, key=key.fingerprint)
        signed = await self._sign(stamp_id, req.job(t, statement.text()), key)
        await self._store(stamp_id, signed, signed.text, "receipt")
        return statement, signed.text

    async def manifest(self, req: ManifestRequest, key: ServedKey | None = None) -> str:
        """The signed manifest: journalled (the stamp and its digests, one transaction), then
        signed by one worker with one signature; returned once it is stored."""
        key = key or self.keys[0]
        stamp_id, t = await self._record(req, key)
        job = req.job(t, self.public_url, stamp_id, key.fingerprint)
        signed = await self._sign(stamp_id, job, key)
        try:
            text = job.signed(signed.text)
        except ValueError as e:
            await self._failed(stamp_id, f"malformed answer: {e}")
            raise SigningFailed("the worker's answer was malformed") from e
        await self._store(stamp_id, signed, text, "manifest")
        return text

    async def timestamp(self, req: TimestampRequest, key: ServedKey, policy: str,
                        accuracy: int | None) -> bytes:
        """An RFC 3161 token (CMS ContentInfo, DER) for ``req``, signed by the TSA ``key``:
        its serial number is the journal row's id and its genTime the journal time."""
        stamp_id, t = await self._record(req, key)
        signed = await self._sign(stamp_id, req.job(t, stamp_id, policy, accuracy), key)
        self.journal.signed(stamp_id, signed.worker, signed.attempts, None)
        return base64.b64decode(signed.text)
