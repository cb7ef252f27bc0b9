"""The log's side of the witness protocol (c2sp.org/tlog-witness): every new checkpoint goes
to the configured witnesses, and their cosignatures onto the published checkpoint.

Each witness has a task of its own in the process that sequences (`server.tlog.sequencer`):

- it sends the newest checkpoint the witness has not cosigned, ``POST <url>/add-checkpoint``
  with ``old <the size the witness last cosigned for this log>`` (0 at first: the size of its
  last valid cosignature, never a size it only claimed) and the consistency proof from that
  size, read from the tiles; on 409 it tries once more from the witness's size, a hint for
  that one request: a size above the checkpoint's fails the attempt and is not kept;
- one request at a time: a witness still busy with a checkpoint gets the newest one when it
  answers (a slow witness is caught up, not queued up);
- a failure (no answer within ``timeout``, a refusal, an answer without a valid cosignature)
  holds the witness back for a delay that doubles from ``retry_base`` to ``retry_max``; after
  it the current checkpoint goes again, new stamps or not, so a witness that comes back is
  caught up;
- the cosignatures that verify with the witness's key over this very checkpoint, dated
  within ``cosignature_skew`` seconds of this log's clock, go to ``on_cosigned``, which adds
  them to the published note if it is still the newest. A cosignature's time is an upper
  bound verifiers rely on (the checkpoint existed by then): one dated outside the window
  (2**63 - 1, 1970) is refused, counted per witness and shown with the reason.

Nothing here holds the sequencer up: it only hands the newest checkpoint over (`offer`).

The state of every witness (`WitnessState`) is kept in memory; the host's other HTTP processes
see it in this process's reports to the host's coordinator (`server.runtime.siblings`), read back
with `states_of`. (It was a JSON file under ``run/`` before.)

`policy_text` is the server's verification policy in c2sp tlog-policy form.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from formats.note import Note, NoteError, Signature, Verifier, parse_note
from formats.tlog.checkpoint import Checkpoint, CosignatureVerifier, cosignature_timestamp
from formats.tlog.errors import TlogError
from formats.tlog.merkle import NodeReader, consistency_proof
from formats.tlog.witness import (
    MAX_REQUEST_BYTES,
    AddCheckpoint,
    WitnessError,
    parse_cosignatures,
    parse_size,
)
from server.setting_values import WitnessConfig, redact_userinfo

if TYPE_CHECKING:  # (httpx is imported when the witnesses are first sent to: not at start)
    import httpx

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = MAX_REQUEST_BYTES  # an answer is a few signature lines: more is refused
USER_AGENT = "stampd-log"


class WitnessFailed(Exception):
    """A witness did not cosign: no answer, a refusal, or an answer without a valid
    cosignature. The message says which, for the operator."""


class CosignatureRefused(WitnessFailed):
    """The witness's cosignature verifies, but is dated outside the window around this log's
    clock (``STAMPD_WITNESS_CLOCK_SKEW``): its time cannot be relied on, it is not published."""


@dataclass(frozen=True)
class Offered:
    """A published checkpoint as it goes to the witnesses: its note with the log's signature
    only (cosignatures are the witnesses' own business), and its parsed body."""

    note: bytes
    text: str
    checkpoint: Checkpoint

    @classmethod
    def of(cls, note: bytes, log_key: Verifier) -> Offered:
        """The checkpoint of a published ``note``, less any signature but the log key's."""
        parsed = parse_note(note)
        own = tuple(s for s in parsed.signatures
                    if s.name == log_key.name and s.key_id == log_key.key_id)
        return cls(Note(parsed.text, own).encode(), parsed.text, Checkpoint.parse(parsed.text))


@dataclass
class WitnessState:
    """What the log knows of one witness (shown on /readyz, /metrics, the status page)."""

    name: str
    url: str  # (without credentials: `WitnessConfig.public_url`)
    cosigned_size: int | None = None  # the size of the last checkpoint it cosigned for us
    cosigned_root: str | None = None  # (base64; with the size: which checkpoint)
    cosigned_at: float | None = None  # when its last valid cosignature came in (our clock)
    errors: int = 0  # failed attempts since this process began sending
    refused_cosignatures: int = 0  # of them, valid cosignatures dated outside the window
    consecutive_errors: int = 0
    last_error: str | None = None
    next_attempt_at: float = 0.0  # not before (a failing witness's backoff)

    def lag(self, published: int | None) -> int | None:
        """Entries of the published checkpoint the witness has not cosigned yet."""
        if published is None:
            return None
        return max(0, published - (self.cosigned_size or 0))

    def has_cosigned(self, offered: Offered) -> bool:
        return (self.cosigned_size == offered.checkpoint.size and self.cosigned_root
                == base64.b64encode(offered.checkpoint.root).decode("ascii"))


@dataclass(frozen=True)
class Backoff:
    """The delay before the next attempt after ``failures`` failures in a row: ``base``
    doubling up to ``limit`` (0 without failure)."""

    base: float = 1.0
    limit: float = 30.0

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.limit, self.base * 2 ** min(failures - 1, 62)))


def verified_cosignatures(answer: bytes, text: str, verifier: CosignatureVerifier, *,
                          now: float, skew: float) -> list[Signature]:
    """The cosignatures of a 200 answer that verify with the witness's key over the
    checkpoint ``text`` and are dated at most ``skew`` seconds from ``now`` (this log's
    clock); the others (other keys, other types) are ignored, as the spec says.
    `WitnessFailed` when the answer is not signature lines or none of them verifies,
    `CosignatureRefused` when those that verify are all dated outside the window."""
    try:
        lines = parse_cosignatures(answer)
    except WitnessError as e:
        raise WitnessFailed(f"answer is not cosignature lines: {e}") from None
    good = [s for s in lines if s.name == verifier.name and s.key_id == verifier.key_id
            and verifier.verify(text.encode(), s.signature)]
    if not good:
        raise WitnessFailed(f"no valid cosignature by {verifier.name} of this checkpoint in "
                            f"its answer ({len(lines)} signature lines)")
    timely = [s for s in good if abs(cosignature_timestamp(s.signature) - now) <= skew]
    if not timely:
        t = cosignature_timestamp(good[-1].signature)
        off = f"{now - t:.0f} s before" if t < now else f"{t - now:.0f} s after"
        raise CosignatureRefused(f"its cosignature is dated {t}, {off} this server's clock: "
                                 f"outside the {skew:g} s allowed (STAMPD_WITNESS_CLOCK_SKEW); "
                                 "refused")
    return timely[-1:]  # (one per key: the note keeps one)


def merge_cosignatures(note: bytes, cosignatures: Sequence[Signature], log_key: Verifier,
                       order: Sequence[str] = ()) -> bytes:
    """``note`` with ``cosignatures`` added: the log's signature first, then one signature per
    other key (a new one replaces an older one of the same name and key ID), in the order of
    the witness names ``order`` (others after them, in their order)."""
    parsed = parse_note(note)
    own = [s for s in parsed.signatures if s.name == log_key.name and s.key_id == log_key.key_id]
    others: dict[tuple[str, int], Signature] = {}
    for s in (*parsed.signatures, *cosignatures):
        if (s.name, s.key_id) != (log_key.name, log_key.key_id):
            others[(s.name, s.key_id)] = s  # (in the place of the one it replaces)
    rank = {name: i for i, name in enumerate(order)}
    ranked = sorted(others.values(), key=lambda s: rank.get(s.name, len(rank)))
    return Note(parsed.text, (*own, *ranked)).encode()


def policy_text(log_vkey: str, log_url: str, witnesses: Sequence[WitnessConfig],
                quorum: int) -> str:
    """The server's verification policy (c2sp.org/tlog-policy): its log, its witnesses (their
    URLs without credentials) and the quorum of them a checkpoint needs (``quorum none``
    without witnesses)."""
    lines = [f"log {log_vkey} {log_url}"]
    for w in witnesses:
        lines.append(f"witness {w.name} {w.vkey} {w.public_url}")
    if witnesses:
        lines.append(f"group witnesses {quorum} " + " ".join(w.name for w in witnesses))
        lines.append("quorum witnesses")
    else:
        lines.append("quorum none")
    return "".join(line + "\n" for line in lines)


# -- the states as the other processes see them ------------------------------------------------
def state_items(states: Sequence[WitnessState]) -> list[dict[str, Any]]:
    """The states as JSON objects (what a process reports, `server.runtime.siblings`)."""
    return [asdict(s) for s in states]


def states_of(items: object, witnesses: Sequence[WitnessConfig]) -> list[WitnessState]:
    """The configured witnesses' states from the items the sending process reported (a
    witness it does not list, or no report: never tried)."""
    stored: dict[tuple[str, str], dict[str, Any]] = {}
    with contextlib.suppress(TypeError, KeyError):
        for item in items if isinstance(items, list) else ():
            stored[(item["name"], item["url"])] = item
    out = []
    names = set(WitnessState.__dataclass_fields__)
    for w in witnesses:
        item = stored.get((w.name, w.public_url))
        state = None
        if item is not None:
            with contextlib.suppress(TypeError):
                state = WitnessState(**{k: v for k, v in item.items() if k in names})
        out.append(state or WitnessState(w.name, w.public_url))
    return out


# -- the sender -----------------------------------------------------------------------------
@dataclass
class _Witness:
    config: WitnessConfig
    verifier: CosignatureVerifier
    state: WitnessState
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class WitnessSender:
    """Sends each checkpoint `offer` ed to every witness (see the module docstring).
    ``node_reader(size)`` reads the tree of a published size from the tiles (for consistency
    proofs); ``on_cosigned(offered, cosignatures)`` publishes them. ``clock`` gives the time
    of the states and of the backoff (tests inject it: a wait is then also cut short by
    `offer` or `poke`)."""

    def __init__(
        self,
        witnesses: Sequence[WitnessConfig],
        node_reader: Callable[[int], NodeReader],
        on_cosigned: Callable[[Offered, list[Signature]], Awaitable[object]],
        *,
        timeout: float = 5.0,
        cosignature_skew: float = 60.0,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.node_reader = node_reader
        self.on_cosigned = on_cosigned
        # Called after each change of a state (the HTTP process then reports them at once to
        # the host's coordinator, for the other processes: `server.runtime.siblings`).
        self.on_change: Callable[[], None] = lambda: None
        self.timeout = timeout
        self.cosignature_skew = cosignature_skew
        self.backoff = backoff or Backoff()
        self.clock = clock
        self._transport = transport
        self._witnesses = [_Witness(w, w.verifier, WitnessState(w.name, w.public_url))
                           for w in witnesses]
        self._latest: Offered | None = None
        self._client: httpx.AsyncClient | None = None
        self.sending = False  # whether this process sends (it has been offered a checkpoint)

    @property
    def order(self) -> list[str]:
        return [w.config.name for w in self._witnesses]

    def states(self) -> list[WitnessState]:
        return [w.state for w in self._witnesses]

    @property
    def latest(self) -> Offered | None:
        return self._latest

    # -- feeding ------------------------------------------------------------------------
    def offer(self, offered: Offered) -> None:
        """The newest published checkpoint: each witness gets it when it is free and due.
        (Called in the event loop of the sender; the first call starts the witnesses' tasks.)"""
        self._latest = offered
        if not self.sending:
            self._begin()
        for w in self._witnesses:
            w.wake.set()

    def seed(self, note: bytes) -> None:
        """Take the cosignatures a published ``note`` carries (the log's own, from before a
        restart) as cosigned: the witnesses that signed it are not asked again for it."""
        try:
            parsed = parse_note(note)
            cp = Checkpoint.parse(parsed.text)
        except (NoteError, TlogError):
            return
        for w in self._witnesses:
            if any(s.name == w.verifier.name and s.key_id == w.verifier.key_id
                   and w.verifier.verify(parsed.text.encode(), s.signature)
                   for s in parsed.signatures):
                w.state.cosigned_size = cp.size
                w.state.cosigned_root = base64.b64encode(cp.root).decode("ascii")

    def poke(self) -> None:
        """Have every witness task look again (after the injected clock moved)."""
        for w in self._witnesses:
            w.wake.set()

    def _begin(self) -> None:
        import httpx

        self.sending = True
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout), transport=self._transport,
            headers={"User-Agent": USER_AGENT, "Content-Type": "text/plain; charset=utf-8"},
            limits=httpx.Limits(max_keepalive_connections=len(self._witnesses) or 1,
                                keepalive_expiry=60), follow_redirects=False)
        for w in self._witnesses:
            w.task = asyncio.create_task(self._run(w), name=f"witness {w.config.name}")
        self.on_change()

    async def stop(self) -> None:
        tasks = [w.task for w in self._witnesses if w.task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- one witness ----------------------------------------------------------------------
    async def _run(self, w: _Witness) -> None:
        while True:
            w.wake.clear()
            offered = self._latest
            if offered is None or w.state.has_cosigned(offered):
                await w.wake.wait()
                continue
            wait = w.state.next_attempt_at - self.clock()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.wake.wait(), wait)
                continue
            try:
                await self.attempt(w, offered)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # (a bug: it shows like a failing witness, and is logged)
                log.exception("witness %s: sending failed", w.config.name)
                self._failed(w, f"{type(e).__name__}: {e}")

    async def attempt(self, w: _Witness, offered: Offered) -> bool:
        """Send ``offered`` to ``w`` once (and once more after a 409); whether it cosigned."""
        import httpx

        try:
            async with asyncio.timeout(self.timeout * 2 + 1):
                cosignatures = await self._add_checkpoint(w, offered)
        except (WitnessFailed, TimeoutError, httpx.HTTPError) as e:
            if isinstance(e, CosignatureRefused):
                w.state.refused_cosignatures += 1
            self._failed(w, _describe(e, self.timeout))
            return False
        s = w.state
        # Published first: if that fails, the witness counts as not having cosigned, and is
        # asked again (it cosigns the same checkpoint again).
        await self.on_cosigned(offered, cosignatures)
        s.cosigned_size = offered.checkpoint.size
        s.cosigned_root = base64.b64encode(offered.checkpoint.root).decode("ascii")
        s.cosigned_at = self.clock()
        s.consecutive_errors, s.last_error, s.next_attempt_at = 0, None, 0.0
        self.on_change()
        return True

    async def _add_checkpoint(self, w: _Witness, offered: Offered) -> list[Signature]:
        """Send ``offered`` from the size ``w`` last cosigned for this log (a valid
        cosignature's, 0 if none), and once more from the size a 409 names: a hint for that
        request only, never kept, and never above the checkpoint's size."""
        size = offered.checkpoint.size
        old = w.state.cosigned_size or 0
        if old > size:
            raise WitnessFailed(f"it has cosigned size {old}, above this checkpoint's "
                                f"size {size}")
        for attempt in range(2):
            proof: list[bytes] = []
            if 0 < old < size:
                proof = await asyncio.to_thread(consistency_proof, old, size,
                                                self.node_reader(size))
            body = AddCheckpoint(old, tuple(proof), offered.note).encode()
            status, answer = await self._post(w.config.public_url + "/add-checkpoint", body,
                                              w.config.credentials)
            if status == 409 and attempt == 0:
                try:
                    old = parse_size(answer)
                except WitnessError as e:
                    raise WitnessFailed(f"409 without a tree size: {e}") from None
                if old > size:
                    raise WitnessFailed(f"409: it says it cosigned size {old}, above this "
                                        f"log's size {size} (another tree of this origin?); "
                                        "asked again from its last cosignature next time")
                continue
            if status != 200:
                text = answer[:200].decode("utf-8", "replace").strip()
                raise WitnessFailed(f"HTTP {status}" + (f": {text}" if text else ""))
            return verified_cosignatures(answer, offered.text, w.verifier, now=self.clock(),
                                         skew=self.cosignature_skew)
        raise WitnessFailed(f"409 twice: it says it cosigned size {old}")

    async def _post(self, url: str, body: bytes, credentials: tuple[str, str] | None
                    ) -> tuple[int, bytes]:
        """POST ``body`` to ``url`` (with HTTP basic authentication by ``credentials``)."""
        assert self._client is not None
        async with self._client.stream("POST", url, content=body, auth=credentials) as r:
            chunks: list[bytes] = []
            total = 0
            async for chunk in r.aiter_bytes():
                total += len(chunk)
                if total > MAX_ANSWER_BYTES:
                    raise WitnessFailed(f"answer of more than {MAX_ANSWER_BYTES} bytes")
                chunks.append(chunk)
            return r.status_code, b"".join(chunks)

    def _failed(self, w: _Witness, error: str) -> None:
        s = w.state
        s.errors += 1
        s.consecutive_errors += 1
        error = redact_userinfo(error)  # (shown and logged: in case it quotes the URL)
        if s.last_error != error:
            log.warning("witness %s (%s): %s", w.config.name, s.url, error)
        s.last_error = error
        s.next_attempt_at = self.clock() + self.backoff.delay(s.consecutive_errors)
        self.on_change()


def _describe(e: BaseException, timeout: float) -> str:
    """One line for an operator."""
    if isinstance(e, WitnessFailed):
        return str(e)
    import httpx

    if isinstance(e, (TimeoutError, httpx.TimeoutException)):
        return f"no answer within {timeout:g} s"
    if isinstance(e, httpx.ConnectError):
        return f"cannot connect: {e}"[:300]
    return f"{type(e).__name__}: {e}"[:300]
