"""The host's budgets, counted in one place: the hourly manifest bytes of ``POST /v1/manifests``
(per client and per host), the manifest bytes in flight, and the witness's ``add-checkpoint``
requests a client may send a minute.

One owner counts them (`HostBudgets`): the HTTP process itself when it is the host's only one
(`LocalBudgets`), else the host's coordinator (`server.coordinator`), which every HTTP process
asks over the one connection it keeps to it. (They were files under ``run/``, read and written
under ``flock`` by each HTTP process in turn, with a slot per process for the bytes in flight
that a dead process's start time had to release.) The coordinator holds each HTTP process's
bytes in flight until it gives them back or its connection closes: a process killed while
holding bytes holds them no more.
"""

from __future__ import annotations

import array
import hashlib
import ipaddress
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from server.errors import Unavailable
from server.settings import Settings

SLOTS = 1 << 16  # client counters of a budget (a keyed hash of the client picks one)
MANIFEST_HOUR = "manifest-bytes"  # the budgets' names, as the coordinator's calls give them
WITNESS_MINUTE = "witness-requests"


class RateLimited(Exception):
    """A request over a budget of this window; the client may come back in ``retry_after``
    seconds (when the window ends). Answered 429 with ``Retry-After``."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class ManifestsBusy(Unavailable):
    """More manifest bytes in flight on this host than ``manifest_bytes_in_flight``."""

    retry_after = 10


def client_key(host: str | None) -> bytes:
    """What a per-client budget counts by: the IPv4 address, or the IPv6 /64 (one site's
    addresses; a client holding a /64 must not get 2**64 budgets)."""
    if host is None:
        return b"?"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host.encode("utf-8", "replace")  # a Unix socket's name, a proxy's token
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped.packed
        return ipaddress.IPv6Network((addr, 64), strict=False).network_address.packed
    return addr.packed


@dataclass
class WindowBudget:
    """At most ``per_client`` ``unit`` per client and ``per_host`` from all clients in each
    window of ``window`` seconds. Fixed windows, aligned to multiples of ``window`` (``clock()
    // window``: the hour, the minute): a window's counters start at 0. A client's counter is
    one of `SLOTS`, picked by a hash of its key keyed with a secret of this budget's (two
    clients may share one by chance, never by choice; the memory is 512 KiB however many
    clients come). 0 = no limit. ``period`` names the window in messages ("this hour")."""

    per_client: int
    per_host: int
    clock: Callable[[], float]
    window: int = 3600
    unit: str = "bytes"
    period: str = "this hour"
    _start: int = field(default=-1, init=False)
    _host: int = field(default=0, init=False)
    _clients: array.array[int] = field(default_factory=lambda: array.array("Q"), init=False)
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32), init=False)

    def charge(self, client: bytes, n: int) -> None:
        """Count ``n`` of ``client``; `RateLimited` (and nothing counted) if that would
        exceed a budget of this window."""
        if not (self.per_client or self.per_host) or n <= 0:
            return
        now = self.clock()
        window = int(now // self.window)
        retry = max(1, int((window + 1) * self.window - now + 0.999))
        if window != self._start:  # a new window: every counter from 0
            self._start, self._host = window, 0
            self._clients = array.array("Q", bytes(8 * SLOTS))
        slot = int.from_bytes(hashlib.blake2b(client, key=self._key, digest_size=8).digest()
                              ) % SLOTS
        used = self._clients[slot]
        if self.per_client and used + n > self.per_client:
            raise RateLimited(
                f"this client sent {used} of its {self.per_client} {self.unit} "
                f"{self.period}; {n} more would exceed them", retry)
        if self.per_host and self._host + n > self.per_host:
            raise RateLimited(
                f"this server took {self._host} of its {self.per_host} {self.unit} "
                f"{self.period}; {n} more would exceed them", retry)
        self._clients[slot] = used + n
        self._host += n


@dataclass
class InFlight:
    """At most ``limit`` bytes of manifest bodies in flight (read, checked, journalled, signed,
    answered) on the host, held by owners (the HTTP processes). A request that would exceed
    it is refused before its body is read (`ManifestsBusy`), unless nothing is in flight: one
    manifest is always taken, whatever its size.

    (Each process once counted its share, ``limit // processes``, and at least one manifest:
    with five HTTP processes, the default on 16 CPUs, five maximal manifests were in flight
    where the budget holds two, and the server grew by 2.1 GiB, `bench.manifest_flood
    --workers 16 --api-processes 5`.)"""

    limit: int
    held: dict[int, int] = field(default_factory=dict)  # owner -> bytes

    @property
    def total(self) -> int:
        return sum(self.held.values())

    def take(self, owner: int, n: int) -> None:
        total = self.total
        if total and total + n > self.limit:
            raise ManifestsBusy(f"{total} bytes of manifests in flight on this server (of "
                                f"{self.limit}); try again later")
        self.held[owner] = self.held.get(owner, 0) + n

    def give(self, owner: int, n: int) -> None:
        left = self.held.get(owner, 0) - n
        if left > 0:
            self.held[owner] = left
        else:
            self.held.pop(owner, None)

    def drop(self, owner: int) -> None:
        """Everything ``owner`` holds (its connection closed: the process is gone)."""
        self.held.pop(owner, None)


class HostBudgets:
    """Every budget of the host, from its settings (``clock``: Unix seconds)."""

    def __init__(self, settings: Settings, clock: Callable[[], float]) -> None:
        self.windows = {
            MANIFEST_HOUR: WindowBudget(settings.manifest_bytes_per_client_hour,
                                        settings.manifest_bytes_per_hour, clock,
                                        unit="manifest bytes"),
            # An honest log sends at most a few a second (a checkpoint, and once more after
            # a 409); a replay costs a read (`server.witness.service.REPLAY_REUSE`), and
            # this bounds those.
            WITNESS_MINUTE: WindowBudget(settings.witness_requests_per_client_minute, 0,
                                         clock, window=60, unit="add-checkpoint requests",
                                         period="this minute"),
        }
        self.in_flight = InFlight(settings.manifest_bytes_in_flight or (1 << 62))

    def charge(self, budget: str, client: bytes, n: int) -> None:
        window = self.windows.get(budget)
        if window is None:
            raise ValueError(f"no budget {budget!r}")
        window.charge(client, n)


class Budgets(Protocol):
    """What an HTTP process asks of the host's budgets (its own `LocalBudgets`, or the
    coordinator's through `server.coordinator.CoordinatorLink`)."""

    async def charge(self, budget: str, client: bytes, n: int) -> None:
        """Count ``n`` of ``client`` in ``budget`` (`MANIFEST_HOUR`, `WITNESS_MINUTE`);
        `RateLimited` (and nothing counted) beyond it."""

    async def take(self, n: int) -> Callable[[], None]:
        """Hold ``n`` manifest bytes in flight (`ManifestsBusy` beyond the budget); what
        gives them back (once, however often it is called)."""


class LocalBudgets:
    """`Budgets` of the host's only HTTP process: it counts them itself."""

    def __init__(self, budgets: HostBudgets) -> None:
        self.budgets = budgets

    async def charge(self, budget: str, client: bytes, n: int) -> None:
        self.budgets.charge(budget, client, n)

    async def take(self, n: int) -> Callable[[], None]:
        self.budgets.in_flight.take(0, n)
        return once(lambda: self.budgets.in_flight.give(0, n))


def once(give: Callable[[], None]) -> Callable[[], None]:
    """``give``, run at the first call only."""
    given = False

    def give_once() -> None:
        nonlocal given
        if not given:
            given = True
            give()

    return give_once
