"""The server's RFC 3161 time-stamping authority, all of its domain in one place (docs/tsa.md):
the key that signs its tokens and the certificate chain published for it (`Tsa`,
`TsaSource`), the check of a client's ``TimeStampReq`` against its policy and clock
(`timestamp_request`), and the request that is journalled and signed like every stamp
(`TimestampRequest`).

The other parts of RFC 3161 live elsewhere: the HTTP front end (``POST /``, ``POST /tsr``,
``GET /tsa.pem``) is `server.api.rfc3161`; the pure format (``TimeStampReq`` parsing,
``TimeStampResp`` building) is `formats.tsp`; the signing worker's side (building and signing
the token, the certificate chain) is `workers.tsa`.
"""

from __future__ import annotations

import base64
import ctypes
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from formats.jobs import TimestampJob
from formats.keys import ServedKey
from formats.tsp.certificates import parse_chain
from formats.tsp.errors import TspError
from formats.tsp.request import parse_request
from keystore.keyset import TSA_CHAIN_FILE
from procs import memory
from server.errors import ClockUnsynchronised
from server.signing_keys import registered_certificates
from server.stamping.requests import Outcome, StampContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tsa:
    """What the RFC 3161 front end serves: the key that signs tokens and its chain."""

    key: ServedKey
    chain_pem: str  # the TSA certificate first
    policy: str
    accuracy: int | None
    allow_sha1: bool
    require_clock_sync: bool


RETRY_EVERY = 5.0  # seconds between looks for a chain that is not there yet


class TsaSource:
    """The server's `Tsa`, once its key has a certificate chain: the chain file in the key's
    directory (made by this host's worker supervisor when it first checked the key), or, on an
    API host without key files, the chain a worker host registered in the database. While
    there is none, RFC 3161 requests are refused and /readyz says so; it is looked for again
    at most every `RETRY_EVERY` seconds."""

    def __init__(self, keys: list[ServedKey], key_id: str, keys_dir: Path, engine: Engine, *,
                 policy: str, accuracy: int, allow_sha1: bool, require_clock_sync: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.key = next((k for k in keys if k.id == key_id), None)
        self.key_id = key_id
        self.chain_file = keys_dir / key_id / TSA_CHAIN_FILE
        self.engine = engine
        self._params = (policy, accuracy or None, allow_sha1, require_clock_sync)
        self.clock = clock
        self._tsa: Tsa | None = None
        self._looked_at: float | None = None
        self._warned = False

    def get(self) -> Tsa | None:
        if self._tsa is None and self.key is not None and (
                self._looked_at is None or self.clock() - self._looked_at >= RETRY_EVERY):
            self._looked_at = self.clock()
            chain = self._find()
            if chain is not None:
                self._tsa = Tsa(self.key, chain, *self._params)
            elif not self._warned:
                self._warned = True
                log.warning("RFC 3161 is on, but key %s has no certificate chain yet (%s, or "
                            "registered by a worker host): RFC 3161 requests are refused until "
                            "it has one", self.key_id, self.chain_file)
        return self._tsa

    def _find(self) -> str | None:
        if self.chain_file.exists():
            text = self.chain_file.read_text()
        else:
            try:
                text = registered_certificates(self.engine, self.key_id) or ""
            except SQLAlchemyError as e:
                log.warning("could not read the registered TSA certificate chain: %s", e)
                return None
        if not text.strip():
            return None
        try:  # a chain that does not parse is not served
            parse_chain(text.encode())
        except TspError as e:
            log.warning("the TSA certificate chain of key %s cannot be read: %s", self.key_id,
                        e)
            return None
        return text


@dataclass(frozen=True)
class TimestampRequest:
    """An RFC 3161 ``TimeStampReq``, checked (`formats.tsp.request.parse_request`): a token for
    a message imprint, under the TSA's ``policy`` and ``accuracy``. Its imprint is journalled
    and logged like a digest stamp's (`server.stamping.requests.Request`)."""

    kind: ClassVar[str] = "tsa"
    noun: ClassVar[str] = "token"
    serial_free: ClassVar[bool] = False  # (the token's serial number is the row's)
    algorithm: str
    digest: str  # lowercase hex
    nonce: int | None
    cert_req: bool
    policy: str
    accuracy: int | None

    def journal_fields(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "digest": self.digest}

    def digest_buckets(self) -> None:
        return None

    def job(self, ctx: StampContext) -> TimestampJob:
        """The token's serial number is the journal row's serial, its genTime the journal
        time."""
        return TimestampJob(hash_algorithm=self.algorithm, digest=self.digest,
                            serial=ctx.serial, time=ctx.time, policy=self.policy,
                            accuracy=self.accuracy,
                            nonce=None if self.nonce is None else str(self.nonce),
                            cert_req=self.cert_req)

    def outcome(self, ctx: StampContext, job: TimestampJob, signed: str) -> Outcome[bytes]:
        """The token (CMS ContentInfo, DER; the worker sends it in base64)."""
        return Outcome(base64.b64decode(signed))


def timestamp_request(tsa: Tsa, body: bytes) -> TimestampRequest:
    """The request a ``TimeStampReq`` (DER) asks ``tsa`` for. `formats.tsp.response.Rejection`
    if the request is refused (RFC 3161 answers that with a rejection, not an HTTP error);
    `ClockUnsynchronised` if the TSA requires a synchronised clock and the kernel says it is
    not."""
    query = parse_request(body, policy=tsa.policy, allow_sha1=tsa.allow_sha1)
    if tsa.require_clock_sync and clock_synchronised() is False:
        raise ClockUnsynchronised("the server's clock is not synchronised; retry later")
    return TimestampRequest(query.hash_algorithm, query.digest.hex(), query.nonce,
                            query.cert_req, tsa.policy, tsa.accuracy)


class _Timex(ctypes.Structure):
    # struct timex (linux/timex.h): the fields up to ``status``, then room for the rest.
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long),
                ("status", ctypes.c_int), ("_rest", ctypes.c_byte * 256)]


TIME_ERROR = 5  # adjtimex(): the clock is not synchronised


@functools.cache
def _adjtimex() -> Callable[..., int] | None:
    """libc's ``adjtimex``, looked up once."""
    try:
        function: Callable[..., int] = memory.libc().adjtimex
    except (OSError, AttributeError):
        return None
    return function


def clock_synchronised() -> bool | None:
    """Whether the kernel reports the system clock synchronised (``adjtimex(2)`` with no
    modes: read only; what ``timedatectl`` shows as "System clock synchronized"); None where it
    cannot be asked."""
    adjtimex = _adjtimex()
    if adjtimex is None:
        return None
    buf = _Timex()
    state = adjtimex(ctypes.byref(buf))
    if state < 0:
        return None
    return bool(state != TIME_ERROR)
