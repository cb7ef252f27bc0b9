"""The proof requests of one HTTP process that wait (``?wait=SECONDS``) for a checkpoint to
cover their stamp (docs/transparency.md, "Waiting for a proof").

A waiter costs nothing while it waits: it is an entry in a table and a future. Its stamp is
looked up when it arrives, together with every other waiter that arrived meanwhile (one query
per `server.tlog.proofs.CHUNK` of them, `server.tlog.proofs.locate_many`), and then only when
a checkpoint of a new size is published (the log writer says when, through the coordinator with
several HTTP processes: `server.coordinator`): in one sweep,
every waiter whose entry the new checkpoint covers is woken, and the stamps of those still
without an entry (not sequenced, or a git object id not journalled yet) are looked up
together again. A woken waiter makes its proof and answers. While no checkpoint is published
(none to sign, or its signing stalls), no waiter costs a query, whatever their number. One task
does all the looking, one step at a time, so a publication is never missed between a waiter's
look and its wait.

Waiters are bounded: ``limit`` in the process and ``per_client`` for one client (an IPv4
address or an IPv6 /64); beyond, `TooManyWaiters` (503 with Retry-After), before any query. A
waiter ends when its time is up, when it is answered, when its client goes away, or when the
process stops (`close`), whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from server.errors import Unavailable
from server.stats import Stats
from server.tlog.proofs import Located

log = logging.getLogger(__name__)

Find = Callable[[Sequence[int], Sequence[str]], tuple[dict[int, Located], dict[str, Located]]]


class TooManyWaiters(Unavailable):
    """This process (or this client) has as many proof requests waiting as it may."""

    retry_after = 5


class Stopping(Unavailable):
    """The process stops: a waiter without its proof is told to ask again (another process,
    or this server once it is back, answers)."""

    retry_after = 1

    def __init__(self) -> None:
        super().__init__("this server process is stopping; ask again")


@dataclass(eq=False)
class Waiter:
    """One waiting proof request: its stamp (``serial`` or ``object_id``) and what is known of
    it. ``looked``: its stamp was looked up since it arrived (else `located` means nothing
    yet); ``located``: the stamp (None: an object id no stamp has yet, or ``unknown``);
    ``unknown``: no stamp has this serial. ``woken`` is done when there is news."""

    client: bytes
    serial: int | None
    object_id: str | None
    looked: bool = False
    located: Located | None = None
    unknown: bool = False
    woken: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def wake(self) -> None:
        if not self.woken.done():
            self.woken.set_result(None)

    def rearm(self) -> None:
        if self.woken.done():
            self.woken = asyncio.get_running_loop().create_future()

    @property
    def pending(self) -> bool:
        """Whether the stamp's entry is still to come (not sequenced, or no such object yet)."""
        if self.unknown:
            return False
        return self.located is None or (self.located.index is None and not self.located.failed)

    def covered(self, size: int | None) -> bool:
        return (size is not None and self.located is not None
                and self.located.index is not None and self.located.index < size)


class ProofWaiters:
    """The waiters of one HTTP process. ``published_size`` reads the published checkpoint's
    size (None: none yet) and ``find`` looks stamps up (`server.tlog.proofs.locate_many`); both
    block and run in a thread. `published` is called on the event loop whenever the checkpoint
    may have changed. ``stats`` counts the waiters and those refused."""

    def __init__(self, published_size: Callable[[], int | None], find: Find, *,
                 limit: int, per_client: int, stats: Stats | None = None) -> None:
        self.published_size = published_size
        self.find = find
        self.limit = limit
        self.per_client = per_client
        self.stats = stats or Stats()
        self.size: int | None = None  # the published checkpoint's, as last read
        self.closing = False  # the process stops: every waiter answers now, none waits
        self._waiters: set[Waiter] = set()
        self._clients: Counter[bytes] = Counter()
        self._arrived: list[Waiter] = []  # not looked up yet
        self._changed = False  # a publication not looked at yet
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._waiters)

    @contextlib.contextmanager
    def waiting(self, client: bytes, serial: int | None, object_id: str | None
                ) -> Iterator[Waiter]:
        """A waiter in the table for the block, to be looked up with the others that arrive
        meanwhile (it is woken then); `TooManyWaiters` when there is no room."""
        if len(self._waiters) >= self.limit:
            self.stats.proof_waiters_refused += 1
            raise TooManyWaiters(f"{len(self._waiters)} proof requests are waiting on this "
                                 "server process, as many as it lets wait; ask again later")
        if self._clients[client] >= self.per_client:
            self.stats.proof_waiters_refused += 1
            raise TooManyWaiters(f"this client has {self.per_client} proof requests waiting, "
                                 "as many as one client may; ask again later")
        w = Waiter(client, serial, object_id)
        self._waiters.add(w)
        self._clients[client] += 1
        self.stats.proof_waiters = len(self._waiters)
        self._arrived.append(w)
        self._kick()
        try:
            yield w
        finally:
            self._waiters.discard(w)
            self.stats.proof_waiters = len(self._waiters)
            self._clients[client] -= 1
            if not self._clients[client]:
                del self._clients[client]

    def published(self) -> None:
        """The checkpoint may have changed: look (once more, if a look is under way)."""
        self._changed = True
        self._kick()

    def close(self) -> None:
        """The process is stopping: wake every waiter (each answers what it has now)."""
        if self.closing:
            return
        self.closing = True
        for w in list(self._waiters):
            w.wake()

    # -- the one task that looks ----------------------------------------------------------
    def _kick(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._looking())

    async def _looking(self) -> None:
        try:
            while self._arrived or self._changed:
                arrived, self._arrived = self._arrived, []
                try:
                    await self._step(arrived)
                except Exception:  # (a database down: the arrivals look for themselves)
                    log.warning("proof waiters: looking their stamps up failed", exc_info=True)
                    for w in arrived:
                        w.wake()
        finally:
            self._task = None

    async def _step(self, arrived: list[Waiter]) -> None:
        grew = False
        if self._changed:
            self._changed = False
            size = await asyncio.to_thread(self.published_size)
            grew = size is not None and size != self.size
            self.size = size
        size = self.size
        ask = [w for w in arrived if w in self._waiters]
        if grew:
            for w in self._waiters:
                if w.covered(size):
                    w.wake()
            new = set(ask)
            ask += [w for w in self._waiters if w.looked and w.pending and w not in new]
        if not ask:
            return
        serials = sorted({w.serial for w in ask if w.serial is not None})
        objects = sorted({w.object_id for w in ask if w.object_id is not None})
        by_serial, by_object = await asyncio.to_thread(self.find, serials, objects)
        for w in ask:
            if w.serial is not None:
                w.located = by_serial.get(w.serial)
                w.unknown = w.located is None
            else:
                w.located = by_object.get(w.object_id or "")
            arrival = not w.looked
            w.looked = True
            if arrival or w.covered(size) or w.unknown or (
                    w.located is not None and w.located.failed):
                w.wake()
